"""The benchmark's own protocol on its videos (``eval_vsi.py --protocol video``) and the mini benchmark
it runs on offline (``scripts/make_mini_vsibench.py``): frame sampling against the reference formulas,
resizing against qwen-vl-utils' own code, the exact reference prompt, records that ``--score-file``
reads back to the same numbers, the tiny model end to end (base and PPO checkpoint), the interactive
and video reports of the same rows paired in one comparison, and one-line errors on bad input."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import eval_vsi
from a2c_ppo_acktr.common import prompts, scoring
from a2c_ppo_acktr import reports
from a2c_ppo_acktr.eval import video_protocol as vp
from a2c_ppo_acktr.config.cli import run_main
from a2c_ppo_acktr.envs.vsibench import load_vsibench_rows

REPO = Path(__file__).resolve().parent.parent
FAST = ["--log.progress_bar", "false"]


def _mini_module():
    spec = importlib.util.spec_from_file_location("make_mini_vsibench", REPO / "scripts" / "make_mini_vsibench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def mini(tmp_path_factory) -> Path:
    """2 rooms, 16 frames of 64x64 at 2 fps each: about 20 questions of all 10 types (~2 s)."""
    out = tmp_path_factory.mktemp("mini")
    _mini_module().make_mini_vsibench(out, scenes=2, seed=0, frames=16, size=64)
    return out


def _video(mini: Path, argv: list[str], out: Path) -> dict:
    assert eval_vsi.main(["--protocol", "video", "--vsibench", str(mini / "test.parquet"), "--video-root", str(mini),
                          *FAST, *argv, "--out", str(out)]) == 0
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
    assert long.read_frames == 768 and long.indices[0] == 0 and long.indices[-1] == 30 * 600 - 1 and len(long.indices) == 32
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
        return frames[idx], {"fps": 30.0, "frames_indices": idx, "total_num_frames": len(frames)}, n / len(frames) * 30.0

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
    mc = prompts.benchmark_prompt("object_rel_direction_easy", "Is the sofa to my left or right?", ["A. left", "B. right"])
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
    assert eval_vsi.main(["--score-file", str(tmp_path / "oracle" / "records.jsonl"), "--out", str(tmp_path / "scored")]) == 0
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


@pytest.mark.parametrize("family,sampling,visual", [
    ("qwen2_vl", "qwen_2fps", "video"), ("qwen3_vl", "qwen3_2fps", "video"), ("llava", "uniform", "images"), ("llava_next", "uniform", "images"),
])
def test_every_tiny_family_answers_under_its_reference_sampling(mini, tiny_family_path, tmp_path, family, sampling, visual):
    rep = _video(mini, ["--model-path", tiny_family_path(family), "--num-frames", "4", "--limit", "3"], tmp_path / family)
    assert rep["meta"]["family"] == family and rep["meta"]["frame_sampling"] == sampling
    assert rep["meta"]["generation"]["video_input"] == visual and len(_records(tmp_path / family)) == 3


def test_a_ppo_checkpoint_is_evaluated_with_its_adapter(mini, tmp_path, tiny_run, tiny_model_path):
    import torch

    from a2c_ppo_acktr.config.arguments import RunConfig
    from a2c_ppo_acktr.policy.model import VLMPolicy

    cfg = RunConfig.from_dict({"model": {"model_path": tiny_model_path}})
    torch.manual_seed(0)
    trained = VLMPolicy(cfg.model)
    with torch.no_grad():  # stand-in for training; LoRA B starts at zero, so this makes the adapter matter
        for p in trained.trainable_parameters():
            p.add_(0.2 * torch.randn_like(p))
    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint-000001"
    trained.save_pretrained(ckpt / "policy")
    cfg.save(ckpt / "config.yaml")
    del trained
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
    assert eval_vsi.main([
        "--vsibench", str(mini / "test.parquet"), "--data-root", str(mini / "scans"), "--model-path", tiny_model_path,
        "--env.image_size", "64", "--env.num_sweep_frames", "4", "--env.max_turns", "1", "--eval.batch_size", "2",
        "--eval.num_trajectory_pictures", "0", *FAST, "--out", str(inter),
    ]) == 0
    a = json.loads((inter / "report.json").read_text())
    b = tiny_run[1]
    assert a["meta"]["num_skipped"] == 0 and a["counts"] == b["counts"]
    paths = reports.compare_reports([inter / "report.json", tiny_run[0] / "report.json"], tmp_path / "cmp",
                                    names=["interactive", "video"], paired=[("video", "interactive")])
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
