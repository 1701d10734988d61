"""The benchmark's own protocol on its videos (``eval_vsi.py --protocol video``) and the mini benchmark
it runs on offline (``scripts/make_mini_vsibench.py``): frame sampling against the reference formulas,
resizing against qwen-vl-utils' own code, the exact reference prompt, records that ``--score-file``
reads back to the same numbers, the tiny model end to end (base and PPO checkpoint), the interactive
and video reports of the same rows paired in one comparison, and one-line errors on bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import eval_vsi
from a2c_ppo_acktr.common import prompts, scoring
from a2c_ppo_acktr import reports
from a2c_ppo_acktr.eval import video_protocol as vp
from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.config.cli import run_main
from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows
from helpers import perturbed_checkpoint

REPO = Path(__file__).resolve().parent.parent
FAST = ["--log.progress_bar", "false"]


def _video(mini: Path, argv: list[str], out: Path) -> dict:
    assert (
        eval_vsi.main(
            [
                "--protocol",
                "video",
                "--vsibench",
                str(mini / "test.parquet"),
                "--video-root",
                str(mini),
                *FAST,
                *argv,
                "--out",
                str(out),
            ]
        )
        == 0
    )
    return json.loads((out / "report.json").read_text())


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def _pyav_frames(path: Path) -> np.ndarray:
    import av

    with av.open(str(path)) as c:
        return np.stack([f.to_ndarray(format="rgb24") for f in c.decode(video=0)])


def _write_video(path: Path, frames: np.ndarray, fps: int) -> None:
    import av

    with av.open(str(path), "w") as c:
        s = c.add_stream("libx264", rate=fps)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for rgb in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)


# ------------------------------------------------------------------------------------ frames
def test_frame_indices_follow_the_reference_formulas():
    # thinking-in-space's load_video: np.linspace(0, total - 1, N, dtype=int) over every frame.
    assert vp.uniform_frames(100, 30.0, 8).indices.tolist() == [0, 14, 28, 42, 56, 70, 84, 99]
    for total, n in [(1, 1), (7, 32), (1800, 32), (16, 16)]:
        assert vp.uniform_frames(total, 30.0, n).indices.tolist() == np.linspace(0, total - 1, n).astype(int).tolist()
    # lmms-eval's Qwen2/2.5-VL: qwen-vl-utils reads 2 fps (300 frames at 30 fps -> 10 s -> 20 frames,
    # round(linspace(0, 299, 20))), then np.linspace(0, 19, 8, dtype=int) of those.
    read = [round(k * 299 / 19) for k in range(20)]
    assert vp.qwen_2fps_frames(300, 30.0, 8).indices.tolist() == [read[i] for i in (0, 2, 5, 8, 10, 13, 16, 19)]
    assert vp.qwen_2fps_frames(300, 30.0, 8).read_frames == 20
    # A long video: qwen-vl-utils reads at most 768 frames; the 32 shown span the whole video.
    long = vp.qwen_2fps_frames(30 * 600, 30.0, 32)
    assert (
        long.read_frames == 768
        and long.indices[0] == 0
        and long.indices[-1] == 30 * 600 - 1
        and len(long.indices) == 32
    )
    # On a 2-fps video with an even frame count the reader keeps every frame: all samplers agree.
    for name in vp.FRAME_SAMPLERS:
        assert vp.sample_frames(name, 16, 2.0, 8).indices.tolist() == [0, 2, 4, 6, 8, 10, 12, 15]
    # Fewer frames than asked: Qwen2/2.5 repeat frames, Qwen3 keeps each once.
    assert len(vp.qwen_2fps_frames(16, 2.0, 32).indices) == 32
    assert vp.qwen3_2fps_frames(16, 2.0, 32).indices.tolist() == list(range(16))
    with pytest.raises(ValueError, match="unknown frame sampling 'linear'.*qwen_2fps"):
        vp.sample_frames("linear", 16, 2.0, 8)


def test_read_clip_decodes_exactly_the_sampled_frames(mini):
    path = next((mini / "arkitscenes").glob("*.mp4"))
    every = _pyav_frames(path)
    assert vp.probe_video(path) == (16, 2.0) == (len(every), 2.0)
    clip = vp.read_clip(path, "uniform", 5)
    assert clip.sample.indices.tolist() == [0, 3, 7, 11, 15]
    np.testing.assert_array_equal(clip.frames, every[[0, 3, 7, 11, 15]])
    # Repeats and any order are served from one decoding pass.
    np.testing.assert_array_equal(vp.decode_frames(path, [15, 0, 0]), every[[15, 0, 0]])


def test_frames_and_resize_equal_qwen_vl_utils_own_pipeline(tmp_path, monkeypatch):
    """lmms-eval's Qwen2.5-VL path is ``process_vision_info`` on the file, then linspace over its frames.
    With only qwen-vl-utils' file reader swapped for PyAV (its own readers cannot run here), its
    ``fetch_video`` must give the very tensor this module shows the model."""
    import torch
    from qwen_vl_utils import vision_process as qv

    rng = np.random.default_rng(0)
    video = tmp_path / "clip.mp4"
    _write_video(video, rng.integers(0, 256, (90, 60, 80, 3), dtype=np.uint8), fps=30)  # 3 s, 80x60 (4:3)

    def pyav_reader(ele):  # qv._read_video_torchvision with read_video replaced by PyAV
        frames = torch.from_numpy(_pyav_frames(Path(ele["video"]))).permute(0, 3, 1, 2)
        n = qv.smart_nframes(ele, total_frames=len(frames), video_fps=30.0)
        idx = torch.linspace(0, len(frames) - 1, n).round().long()
        return (
            frames[idx],
            {"fps": 30.0, "frames_indices": idx, "total_num_frames": len(frames)},
            n / len(frames) * 30.0,
        )

    for name in list(qv.VIDEO_READER_BACKENDS):
        monkeypatch.setitem(qv.VIDEO_READER_BACKENDS, name, pyav_reader)
    budget = {"min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28}  # the real Qwen2.5-VL video budget
    reference = qv.fetch_video({"video": str(video), **budget})
    reference = reference[np.linspace(0, len(reference) - 1, 4, dtype=int)]  # lmms-eval's max_num_frames step

    clip = vp.read_clip(video, "qwen_2fps", 4)
    ours = vp.qwen_resize(clip.frames, **budget, patch_size=14, merge_size=2, read_frames=clip.sample.read_frames)
    # 80x60 is below the 128-token minimum: smart_resize scales it up to 392x280 (multiples of 28).
    assert clip.sample.read_frames == 6 and ours.shape == (4, 3, 280, 392) and ours.dtype == torch.float32
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)


# ------------------------------------------------------------------------------------ prompt
def test_the_prompt_is_the_reference_text_exactly(tiny_model_path):
    numerical = prompts.benchmark_prompt("object_counting", "How many chair(s) are in this room?", None)
    assert numerical == (
        "These are frames of a video.\nHow many chair(s) are in this room?\n"
        "Please answer the question using a single word or phrase."
    )
    mc = prompts.benchmark_prompt(
        "object_rel_direction_easy", "Is the sofa to my left or right?", ["A. left", "B. right"]
    )
    assert mc == (
        "These are frames of a video.\nIs the sofa to my left or right?\nOptions:\nA. left\nB. right\n"
        "Answer with the option's letter from the given choices directly."
    )
    with pytest.raises(ValueError, match="needs its options"):
        prompts.benchmark_prompt("route_planning", "Which turn?", None)
    from a2c_ppo_acktr.policy.loading import load_processor

    rendered = prompts.render_prompt(load_processor(tiny_model_path), prompts.benchmark_messages(numerical))
    assert rendered == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        f"<|vision_start|><|video_pad|><|vision_end|>{numerical}<|im_end|>\n<|im_start|>assistant\n"
    )


# ------------------------------------------------------------------------------- mini benchmark
def test_mini_benchmark_rows_pass_the_loader_cover_all_types_and_follow_the_video(mini):
    rows = load_vsibench_rows(mini / "test.parquet")  # the loader's own validation
    assert {r["question_type"] for r in rows} == set(scoring.TASKS)
    assert [r["id"] for r in rows] == list(range(len(rows)))
    assert all(vp.video_file(mini, r["dataset"], r["scene_name"]).is_file() for r in rows)
    manifest = json.loads((mini / "manifest.json").read_text())
    for scene in manifest["scenes"]:
        order = scene["appearance_order"]
        assert len(order["frames"]) == len(order["object_ids"]) and max(order["frames"]) < scene["frames"] == 16
        for q in scene["questions"]:
            if q["question_type"] == "obj_appearance_order":
                # The answer's categories first appear in this order over the video's own frames.
                assert q["meta"]["first_frames"] == sorted(q["meta"]["first_frames"])
                assert len(set(q["meta"]["first_frames"])) == 4
    appearance = [r for r in rows if r["question_type"] == "obj_appearance_order"]
    for r in appearance:
        scene = next(s for s in manifest["scenes"] if s["scene_name"] == r["scene_name"])
        meta = next(q["meta"] for q in scene["questions"] if q["question"] == r["question"])
        correct = next(o for o in r["options"] if o.startswith(r["ground_truth"] + "."))
        assert correct == f"{r['ground_truth']}. {', '.join(meta['order'])}"


# ------------------------------------------------------------------------- records and reports
def test_oracle_scores_100_and_score_file_reads_the_records_back(mini, tmp_path):
    rep = _video(mini, ["--oracle"], tmp_path / "oracle")
    assert rep["overall"] == 100.0 and set(rep["table"].values()) == {100.0} and rep["tasks_missing"] == []
    assert rep["mode"] == "video" and rep["meta"]["protocol"] == "video" and "agent" not in rep
    records = _records(tmp_path / "oracle")
    assert len(records) == rep["meta"]["num_questions"] == len(load_vsibench_rows(mini / "test.parquet"))
    assert {"id", "question_type", "prediction", "ground_truth", "score"} <= set(records[0])
    assert (
        eval_vsi.main(["--score-file", str(tmp_path / "oracle" / "records.jsonl"), "--out", str(tmp_path / "scored")])
        == 0
    )
    scored = json.loads((tmp_path / "scored" / "report.json").read_text())
    assert scored["overall"] == 100.0 and scored["malformed"]["count"] == 0


def test_score_file_gives_the_video_report_numbers_exactly(mini, tmp_path):
    """Random answers (the dummy) give partial MRA scores: the records' own scores, the video report
    and --score-file on records.jsonl must agree to the bit."""
    rep = _video(mini, ["--dummy"], tmp_path / "dummy")
    records = _records(tmp_path / "dummy")
    assert 0 < rep["overall"] < 100
    for r in records:
        assert r["score"] == scoring.score_prediction(r["question_type"], r["prediction"], r["ground_truth"])
    scored = reports.score_file(tmp_path / "dummy" / "records.jsonl")
    for key in ("overall", "per_type", "per_task", "counts", "table"):
        assert scored[key] == rep[key], key


# ------------------------------------------------------------------------------- tiny model
@pytest.fixture(scope="module")
def tiny_run(mini, tmp_path_factory, tiny_model_path):
    out = tmp_path_factory.mktemp("tiny_video")
    rep = _video(mini, ["--model-path", tiny_model_path, "--num-frames", "4", "--batch-size", "3"], out)
    return out, rep


def test_tiny_model_end_to_end_writes_records_and_reports(tiny_run, mini):
    out, rep = tiny_run
    for name in ("records.jsonl", "report.json", "report.md", "tasks.png", "config.yaml"):
        assert (out / name).is_file(), name
    rows = load_vsibench_rows(mini / "test.parquet")
    records = _records(out)
    assert [r["id"] for r in records] == [r["id"] for r in rows]
    meta = rep["meta"]
    assert meta["family"] == "qwen2_5_vl" and meta["frame_sampling"] == "qwen_2fps" and meta["num_frames"] == 4
    assert meta["generation"]["max_new_tokens"] == 16 and meta["generation"]["do_sample"] is False
    assert meta["batch_size"] == 3 and meta["timings"]["questions"] == len(rows) and meta["timings"]["generate_s"] > 0
    for r in records:
        assert r["frame_indices"] == [0, 5, 10, 15]  # qwen_2fps on a 16-frame 2-fps video
        assert isinstance(r["prediction"], str) and r["prediction"]
    assert len({r["prediction"] for r in records}) > 1  # answers depend on the question and frames
    assert [r["episode_id"] for r in rep["records"]] == [f"vsibench-{r['id']}" for r in rows]
    assert reports.score_file(out / "records.jsonl")["overall"] == rep["overall"]


def test_batching_with_left_padding_does_not_change_answers(mini, tiny_model_path):
    from a2c_ppo_acktr.config.arguments import RunConfig
    from a2c_ppo_acktr.eval.evaluation import load_policy

    policy = load_policy(RunConfig.from_dict({"model": {"model_path": tiny_model_path}}))
    rows = load_vsibench_rows(mini / "test.parquet")
    questions = vp.video_questions(rows[::3], mini)  # mixed lengths and both videos
    answers = {}
    for b in (1, len(questions)):
        cfg = vp.VideoProtocolConfig(video_root=str(mini), num_frames=4, frame_sampling="qwen_2fps", batch_size=b)
        answers[b] = [r["prediction"] for r in vp.run_video_protocol(questions, vp.ModelAnswerer(policy), cfg).records]
    assert answers[1] == answers[len(questions)]


@pytest.mark.parametrize(
    "family,sampling,visual",
    [
        ("qwen2_vl", "qwen_2fps", "video"),
        ("qwen3_vl", "qwen3_2fps", "video"),
        ("llava", "uniform", "images"),
        ("llava_next", "uniform", "images"),
    ],
)
def test_every_tiny_family_answers_under_its_reference_sampling(
    mini, tiny_family_path, tmp_path, family, sampling, visual
):
    rep = _video(
        mini, ["--model-path", tiny_family_path(family), "--num-frames", "4", "--limit", "3"], tmp_path / family
    )
    assert rep["meta"]["family"] == family and rep["meta"]["frame_sampling"] == sampling
    assert rep["meta"]["generation"]["video_input"] == visual and len(_records(tmp_path / family)) == 3


def test_a_ppo_checkpoint_is_evaluated_with_its_adapter(mini, tmp_path, tiny_run, tiny_model_path):
    ckpt, _ = perturbed_checkpoint(tmp_path, RunConfig.from_dict({"model": {"model_path": tiny_model_path}}))
    rep = _video(mini, ["--checkpoint", str(ckpt), "--num-frames", "4", "--batch-size", "8"], tmp_path / "ckpt")
    assert rep["name"] == "checkpoint-000001 (video)" and rep["meta"]["checkpoint"] == str(ckpt)
    base = [r["prediction"] for r in _records(tiny_run[0])]
    tuned = [r["prediction"] for r in _records(tmp_path / "ckpt")]
    assert tuned != base  # the adapter is active in generate


@pytest.mark.slow
def test_interactive_and_video_reports_of_the_same_rows_compare_and_pair(mini, tiny_run, tiny_model_path, tmp_path):
    """The two protocols on the same rows: the interactive one re-renders the rooms from the scans the
    mini benchmark writes; --compare puts them side by side and --paired matches every question."""
    inter = tmp_path / "interactive"
    assert (
        eval_vsi.main(
            [
                "--vsibench",
                str(mini / "test.parquet"),
                "--data-root",
                str(mini / "scans"),
                "--model-path",
                tiny_model_path,
                "--env.image_size",
                "64",
                "--env.num_sweep_frames",
                "4",
                "--env.max_turns",
                "1",
                "--eval.batch_size",
                "2",
                "--eval.num_trajectory_pictures",
                "0",
                *FAST,
                "--out",
                str(inter),
            ]
        )
        == 0
    )
    a = json.loads((inter / "report.json").read_text())
    b = tiny_run[1]
    assert a["meta"]["num_skipped"] == 0 and a["counts"] == b["counts"]
    paths = reports.compare_reports(
        [inter / "report.json", tiny_run[0] / "report.json"],
        tmp_path / "cmp",
        names=["interactive", "video"],
        paired=[("video", "interactive")],
    )
    md = paths["md"].read_text()
    assert "| interactive |" in md and "| video |" in md and f"| video - interactive | {len(b['records'])} |" in md


# ------------------------------------------------------------------------------------ bad input
def _cli_error(argv: list[str], capsys) -> str:
    assert run_main(lambda: eval_vsi.main(argv), "eval_vsi.py") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    return err[0]


def test_bad_input_gives_one_line_errors(mini, tmp_path, capsys):
    rows = str(mini / "test.parquet")
    base = ["--protocol", "video", "--vsibench", rows, "--oracle", *FAST, "--out", str(tmp_path / "o")]
    (tmp_path / "empty").mkdir()
    err = _cli_error([*base, "--video-root", str(tmp_path / "empty")], capsys)
    missing = tmp_path / "empty" / "arkitscenes" / "proc_000000.mp4"
    assert f"video {str(missing)!r} of VSI-Bench row 0 does not exist (2 of 2 videos missing)" in err
    assert "<dataset>/<scene_name>.mp4" in err
    err = _cli_error([*base, "--video-root", str(tmp_path / "nowhere")], capsys)
    assert "is not a directory" in err

    broken = tmp_path / "broken"
    shutil.copytree(mini / "arkitscenes", broken / "arkitscenes")
    first = sorted((broken / "arkitscenes").glob("*.mp4"))[0]
    first.write_bytes(b"this is not an mp4 file" * 20)
    err = _cli_error([*base, "--video-root", str(broken)], capsys)
    assert f"cannot read video {str(first)!r}" in err and "damaged or not a video" in err

    data = (mini / "arkitscenes" / first.name).read_bytes()
    first.write_bytes(data[: len(data) // 2])  # truncated: the container opens, frames are missing
    err = _cli_error([*base, "--video-root", str(broken)], capsys)
    assert str(first) in err and ("truncated" in err or "damaged" in err)

    with pytest.raises(SystemExit):
        eval_vsi.main(["--vsibench", rows, "--video-root", str(mini), "--oracle", "--out", str(tmp_path / "x")])
    assert "belong to --protocol video" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_vsi.main(["--protocol", "video", "--vsibench", rows, "--oracle", "--out", str(tmp_path / "x")])
    assert "needs --vsibench ROWS and --video-root" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        eval_vsi.main([*base, "--video-root", str(mini), "--data-root", str(mini)])
    assert "--data-root belong to the interactive protocol" in capsys.readouterr().err


# ----------------------------------------------------------------------- --prompt agent
def _agent_reply(answer: str) -> str:
    """A well-formed reply in the agent's format, written out here (not by the package's formatter)."""
    return json.dumps({"thoughts": "Seen in the frames.", "action": {"answer": answer}})


def _unique_question_rows(mini: Path, tmp_path: Path) -> tuple[Path, list[dict]]:
    """The mini benchmark's rows whose question text is unique (a reply chosen by question is then the row's)."""
    rows = load_vsibench_rows(mini / "test.parquet")
    texts = [r["question"].strip() for r in rows]
    keep = [r for r, t in zip(rows, texts) if texts.count(t) == 1]
    path = tmp_path / "unique.json"
    path.write_text(json.dumps(keep))
    return path, keep


def _row_in(text: str, rows: list[dict]) -> dict:
    """The row whose question the prompt ``text`` asks (the longest question found in it)."""
    found = [r for r in rows if r["question"].strip() in text]
    assert found, text[-300:]
    return max(found, key=lambda r: len(r["question"].strip()))


class _StubPolicy:
    """Stands in for a loaded VLMPolicy: ``act`` answers each observation with ``reply(row)``."""

    family = "qwen2_5_vl"

    def __init__(self, rows: list[dict], reply) -> None:
        from types import SimpleNamespace

        self.cfg = SimpleNamespace(max_new_tokens=64)
        self.rows, self.reply, self.seen = rows, reply, []

    def act(self, observations, greedy=False, **_):
        from types import SimpleNamespace

        assert greedy
        self.seen.extend(observations)
        return SimpleNamespace(texts=[self.reply(_row_in(o["text"], self.rows)) for o in observations])


def test_the_agent_prompt_is_the_envs_answer_turn_on_the_video_frames(mini, tmp_path):
    _, rows = _unique_question_rows(mini, tmp_path)
    policy = _StubPolicy(rows, lambda r: _agent_reply(r["ground_truth"]))
    questions = vp.video_questions(rows, mini)
    cfg = vp.VideoProtocolConfig(video_root=str(mini), num_frames=5, frame_sampling="uniform", batch_size=4)
    result = vp.run_video_protocol(questions, vp.AgentAnswerer(policy, max_forward=2.5), cfg)
    assert [r["score"] for r in result.records] == [1.0] * len(rows)
    assert len(policy.seen) == len(rows)
    by_question = {o["text"]: o for o in policy.seen}
    for r, rec in zip(rows, result.records):
        opts = "".join(f"\n{o}" for o in r["options"] or [])
        ask = (
            "\nOptions:" + opts + "\nAnswer with the option's letter."
            if r["options"]
            else "\nAnswer with a single number."
        )
        expected = (
            f"Question: {r['question'].strip()}{ask}\nImages: images 1-5 are your latest views, image 5 is the current "
            "one.\n"
            "Last turn: none yet (this is the start).\nThis is your last turn: answer now."
        )
        obs = by_question[expected]
        frames = vp.read_clip(mini / r["dataset"] / f"{r['scene_name']}.mp4", "uniform", 5).frames
        assert len(obs["images"]) == 5 and all(np.array_equal(a, b) for a, b in zip(obs["images"], frames))
        assert (
            rec["reply_kind"] == "answer"
            and rec["prediction"] == r["ground_truth"]
            and rec["frame_indices"] == [0, 3, 7, 11, 15]
        )
    # The policy renders the observation with the training prompt: the agent's system prompt, one image per frame.
    msgs = prompts.build_messages(policy.seen[0])
    assert msgs[0]["content"][0]["text"] == prompts.SYSTEM_PROMPT and [c["type"] for c in msgs[1]["content"]] == [
        "image"
    ] * 5 + ["text"]


MALFORMED = {
    "bare answer, no JSON": lambda gt: gt,  # what the reference prompt asks for, and would score 1 there
    "cut off": lambda gt: '{"thoughts": "Seen.", "action": {"answer": "' + gt,
    "extra key": lambda gt: json.dumps({"thoughts": "x", "action": {"answer": gt}, "confidence": 1}),
    "answer twice": lambda gt: '{"thoughts": "x", "action": {"answer": "' + gt + '", "answer": "' + gt + '"}}',
    "a move": lambda gt: json.dumps(
        {"thoughts": "Look left.", "action": {"rotation_angle_degrees": 30, "forward_meters": 1}}
    ),
    "not a string": lambda gt: None,
    "empty": lambda gt: "",
}


@pytest.mark.parametrize("rule", ["thinking-in-space", "lmms-eval-0.7"])
def test_malformed_agent_replies_score_0_for_their_row_and_the_rest_are_scored(mini, tmp_path, rule):
    _, rows = _unique_question_rows(mini, tmp_path)
    kinds = list(MALFORMED)
    bad = {r["id"]: kinds[k % len(kinds)] for k, r in enumerate(rows[::2])}  # every other row, each kind at least once
    assert set(bad.values()) == set(kinds)
    policy = _StubPolicy(
        rows,
        lambda r: MALFORMED[bad[r["id"]]](r["ground_truth"]) if r["id"] in bad else _agent_reply(r["ground_truth"]),
    )
    cfg = vp.VideoProtocolConfig(
        video_root=str(mini), num_frames=4, frame_sampling="uniform", batch_size=3, scoring_rule=rule
    )
    answerer = vp.AgentAnswerer(policy, max_forward=3.0)
    records = vp.run_video_protocol(vp.video_questions(rows, mini), answerer, cfg).records
    for r, rec in zip(rows, records):
        assert rec["score"] == (0.0 if r["id"] in bad else 1.0), (bad.get(r["id"]), rec)
        if r["id"] in bad:
            assert rec["prediction"] == "" and rec["reply_kind"] == ("move" if bad[r["id"]] == "a move" else "invalid")
    assert answerer.replies == {
        "answer": len(rows) - len(bad),
        "move": list(bad.values()).count("a move"),
        "invalid": len(bad) - list(bad.values()).count("a move"),
    }


def _force_generate(policy, rows: list[dict], reply, prompts_seen: list[str]) -> None:
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    real, tok, eos = policy.model.generate, policy.tokenizer, policy.eos_ids[0]

    def generate(*args, **kwargs):
        ids = kwargs["input_ids"]
        texts = tok.batch_decode(ids, skip_special_tokens=False)
        prompts_seen.extend(texts)
        targets = [tok.encode(reply(_row_in(t, rows)), add_special_tokens=False) + [eos] for t in texts]
        start = ids.shape[1]

        class Force(LogitsProcessor):
            def __call__(self, input_ids, scores):
                t = input_ids.shape[1] - start
                out = torch.full_like(scores, float("-inf"))
                for i, target in enumerate(targets):
                    out[i, target[min(t, len(target) - 1)]] = 0.0
                return out

        procs = LogitsProcessorList([*(kwargs.pop("logits_processor", None) or []), Force()])
        return real(*args, logits_processor=procs, **kwargs)

    policy.model.generate = generate


def test_a_policy_answering_in_the_agent_format_scores_only_under_the_agent_prompt(
    mini, tmp_path, tiny_model_path, monkeypatch
):
    """Side by side on the mini benchmark: the tiny model, loaded by the package's loader and forced to
    reply in the agent's JSON format with each row's ground truth, scores 100 with --prompt agent and
    0 with the reference prompt (its JSON is the prediction there, under the reference's rule)."""
    from a2c_ppo_acktr.eval import evaluation

    path, rows = _unique_question_rows(mini, tmp_path)
    seen: list[str] = []
    real_load = evaluation.load_policy

    def load_policy(*args, **kwargs):
        policy = real_load(*args, **kwargs)
        _force_generate(policy, rows, lambda r: _agent_reply(r["ground_truth"]), seen)
        return policy

    monkeypatch.setattr(evaluation, "load_policy", load_policy)
    common = [
        "--protocol",
        "video",
        "--vsibench",
        str(path),
        "--video-root",
        str(mini),
        "--model-path",
        tiny_model_path,
        "--num-frames",
        "4",
        "--batch-size",
        "4",
        "--model.max_new_tokens",
        "40",
        *FAST,
    ]
    reps = {}
    for prompt in ("reference", "agent"):
        assert eval_vsi.main([*common, "--prompt", prompt, "--out", str(tmp_path / prompt)]) == 0
        reps[prompt] = json.loads((tmp_path / prompt / "report.json").read_text())
        assert sum(("These are frames of a video." in s) == (prompt == "reference") for s in seen) == len(rows)
        assert sum(("This is your last turn: answer now." in s) == (prompt == "agent") for s in seen) == len(rows)
        seen.clear()
    ref, agent = reps["reference"], reps["agent"]
    assert ref["overall"] == 0.0 and agent["overall"] == 100.0
    assert all(r["prediction"].startswith('{"thoughts"') for r in _records(tmp_path / "reference"))
    assert [r["prediction"] for r in _records(tmp_path / "agent")] == [r["ground_truth"] for r in rows]
    assert agent["meta"]["prompt_kind"] == "agent" and agent["meta"]["replies"] == {
        "answer": len(rows),
        "move": 0,
        "invalid": 0,
    }
    assert agent["meta"]["max_new_tokens"] == 40 and ref["meta"]["max_new_tokens"] == 16
    assert (
        agent["name"].endswith(" (video, agent prompt)")
        and ref["name"].endswith(" (video)")
        and ref["meta"]["prompt_kind"] == "reference"
    )
    assert reports.score_file(tmp_path / "agent" / "records.jsonl")["overall"] == 100.0
    paths = reports.compare_reports(
        [tmp_path / "reference" / "report.json", tmp_path / "agent" / "report.json"],
        tmp_path / "cmp",
        names=["reference", "agent"],
        paired=[("agent", "reference")],
    )
    md = paths["md"].read_text()
    assert "| reference | 0.0 |" in md and "| agent | 100.0 |" in md


def _usage_error(argv: list[str], capsys) -> str:
    """An argument error: exit 2 with one ``eval_vsi.py: error:`` line (after argparse's usage line), no traceback."""
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: eval_vsi.main(argv), "eval_vsi.py")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert exit_.value.code == 2 and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def test_prompt_values_and_combinations_give_one_line_errors(mini, tmp_path, capsys):
    rows = str(mini / "test.parquet")
    base = ["--protocol", "video", "--vsibench", rows, "--video-root", str(mini), *FAST, "--out", str(tmp_path / "o")]
    err = _usage_error([*base, "--model-path", "tiny:qwen2_5_vl", "--prompt", "agnet"], capsys)
    assert "--prompt 'agnet' is not one of reference, agent" in err
    err = _usage_error([*base, "--oracle", "--prompt", "agent"], capsys)
    assert "--prompt agent is how a model is asked; --oracle answers without one" in err
    err = _usage_error(["--vsibench", rows, "--dummy", "--prompt", "agent", "--out", str(tmp_path / "o")], capsys)
    assert "--prompt belong to --protocol video" in err
    err = _usage_error(
        [
            "video",
            "--vsibench",
            rows,
            "--video-root",
            str(mini),
            "--dummy",
            "--prompt",
            "",
            "--out",
            str(tmp_path / "o"),
        ],
        capsys,
    )
    assert "--prompt '' is not one of reference, agent" in err
    assert tuple(vp.PROMPTS) == eval_vsi.PROMPTS


def test_a_prompt_too_long_for_the_model_names_num_frames(mini, tmp_path):
    from a2c_ppo_acktr.policy.loading import ContextLengthError

    _, rows = _unique_question_rows(mini, tmp_path)

    class TooLong(_StubPolicy):
        def act(self, observations, greedy=False, **_):
            raise ContextLengthError(
                "a prompt of 9000 tokens + model.max_new_tokens 96 exceeds the model's 8192 positions"
            )

    cfg = vp.VideoProtocolConfig(video_root=str(mini), num_frames=4, frame_sampling="uniform", batch_size=2)
    with pytest.raises(ContextLengthError, match="exceeds the model's 8192 positions; .* lower --num-frames"):
        vp.run_video_protocol(
            vp.video_questions(rows[:2], mini), vp.AgentAnswerer(TooLong(rows, None), max_forward=3.0), cfg
        )


def test_the_agent_prompt_evaluates_a_ppo_checkpoint_with_its_adapter(mini, tmp_path, tiny_model_path):
    """The same loader as the reference prompt: a checkpoint's adapter changes the agent's replies."""
    ckpt, _ = perturbed_checkpoint(
        tmp_path, RunConfig.from_dict({"model": {"model_path": tiny_model_path, "max_new_tokens": 12}})
    )
    common = ["--prompt", "agent", "--num-frames", "4", "--batch-size", "8", "--limit", "6"]
    rep = _video(mini, ["--checkpoint", str(ckpt), *common], tmp_path / "ckpt")
    base = _video(mini, ["--model-path", tiny_model_path, "--model.max_new_tokens", "12", *common], tmp_path / "base")
    assert rep["meta"]["checkpoint"] == str(ckpt) and rep["name"] == "checkpoint-000001 (video, agent prompt)"
    assert base["meta"]["checkpoint"] is None and base["meta"]["prompt_kind"] == "agent"
    assert rep["meta"]["max_new_tokens"] == 12 and sum(rep["meta"]["replies"].values()) == 6
    assert [r["reply"] for r in _records(tmp_path / "ckpt")] != [r["reply"] for r in _records(tmp_path / "base")]
    for r in _records(tmp_path / "ckpt"):  # whatever the tiny model wrote, the row is scored from the parsed reply
        assert r["reply_kind"] in ("answer", "move", "invalid") and (r["reply_kind"] == "answer" or r["score"] == 0.0)


def test_the_agent_prompt_says_when_it_shows_other_frames_than_training(caplog):
    """An agent sees its sweep (and in the interactive mode its last views) per turn in training; the
    agent prompt with another --num-frames says so in one line, and nothing when they agree."""
    import logging

    from a2c_ppo_acktr.config.arguments import load_config

    interactive = load_config(preset="cpu-demo")  # 4 sweep frames + 1 view
    video_qa = load_config(
        preset="debug",
        overrides=[
            "--env.mode",
            "video_qa",
            "--env.max_turns",
            "1",
            "--env.image_history",
            "0",
            "--env.num_sweep_frames",
            "16",
        ],
    )
    assert (vp.trained_frames(interactive), vp.trained_frames(video_qa)) == (5, 16)
    with caplog.at_level(logging.WARNING, logger=vp.__name__):
        vp._warn_unlike_training(5, interactive)
        vp._warn_unlike_training(16, video_qa)
        assert caplog.records == []
        vp._warn_unlike_training(32, interactive)
    (record,) = caplog.records
    assert "shows 32 frames" in record.getMessage() and "--num-frames 5" in record.getMessage()
