"""Evaluation runs end to end: oracle and dummy references, batching, VSI-Bench rows, checkpoints, CLI."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import eval_vsi
from a2c_ppo_acktr.eval import evaluation
from a2c_ppo_acktr import reports
from a2c_ppo_acktr.config.arguments import QUESTION_TYPES, EnvConfig, RunConfig, load_config
from a2c_ppo_acktr.envs import vsi_env
from a2c_ppo_acktr.common.scoring import score_prediction
from a2c_ppo_acktr.labels.teachers import OracleTeacher
from helpers import perturbed_checkpoint, write_arkit_scan

# Small and fast: 32-pixel frames, 4 sweep frames (appearance order needs 4), 3 turns.
SMALL = [
    "--preset",
    "debug",
    "--env.image_size",
    "32",
    "--env.num_sweep_frames",
    "4",
    "--env.max_turns",
    "3",
    "--eval.num_episodes",
    "10",
    "--eval.batch_size",
    "5",
    "--eval.num_trajectory_pictures",
    "2",
    "--log.progress_bar",
    "false",
]


def _cfg(*extra: str):
    over = SMALL[2:] + list(extra)
    return load_config(preset="debug", overrides=over)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The oracle and the dummy evaluated on the same 10 procedural questions, through the CLI."""
    root = tmp_path_factory.mktemp("eval")
    out = {}
    for kind in ("oracle", "dummy"):
        assert eval_vsi.main([*SMALL, f"--{kind}", "--out", str(root / kind)]) == 0
        out[kind] = root / kind
    return out


@pytest.mark.parametrize("kind", ["oracle", "dummy"])
def test_every_report_file_is_written(runs, kind):
    d = runs[kind]
    for name in ("report.json", "report.md", "tasks.png", "config.yaml"):
        assert (d / name).is_file(), name
    rep = json.loads((d / "report.json").read_text())
    assert rep["name"] == kind and rep["mode"] == "episodes"
    # Spread evenly: 10 questions, one of each raw type, in the configured order.
    assert rep["counts"] == {t: 1 for t in QUESTION_TYPES}
    assert [r["question_type"] for r in rep["records"]] == list(QUESTION_TYPES)
    assert rep["tasks_missing"] == [] and set(rep["table"]) == set(reports.SHORT_TASK_NAMES.values())
    for rec in rep["records"]:
        assert rec["turns"] == len(rec["steps"]) == len(rec["actions"]) >= 1
        # The recorded score is the scorer's verdict on the recorded answer.
        assert rec["score"] == pytest.approx(score_prediction(rec["question_type"], rec["answer"], rec["ground_truth"]))
    md = (d / "report.md").read_text()
    assert "| Method | Overall | Obj. Count | Abs. Dist." in md and "success rate" in md
    with Image.open(d / "tasks.png") as im:
        assert im.format == "PNG" and im.size == (1000, 450)
    pictures = sorted((d / "trajectories").glob("*.png"))
    assert [p.stem for p in pictures] == ["proc-0000", "proc-0001"]
    by_id = {r["episode_id"]: r for r in rep["records"]}
    for p in pictures:
        turns = by_id[p.stem]["turns"]
        # By hand from the default layout: one 192-px tile per turn beside the 384-px map; a 56-px
        # header over the taller of tile + 150-px caption (342) and map (384).
        with Image.open(p) as im:
            assert im.format == "PNG" and im.size == (192 * turns + 384, 56 + 384)


def test_oracle_scores_near_one_and_dummy_near_chance(runs):
    oracle = json.loads((runs["oracle"] / "report.json").read_text())
    dummy = json.loads((runs["dummy"] / "report.json").read_text())
    assert oracle["overall"] >= 95.0
    assert oracle["agent"]["success_rate"] == 1.0 and oracle["agent"]["answer_rate"] == 1.0
    assert oracle["agent"]["invalid_output_rate"] == 0.0
    # The dummy always answers (on the last turn at the latest) and only says legal things.
    assert dummy["agent"]["answer_rate"] == 1.0 and dummy["agent"]["invalid_output_rate"] == 0.0
    for rec in dummy["records"]:
        if rec["options"]:
            assert rec["answer"] in [o.split(".")[0] for o in rec["options"]]
        else:
            low, high = vsi_env.DUMMY_NUMBER_RANGES[rec["question_type"]]
            assert low <= float(rec["answer"]) <= high
    assert dummy["overall"] < oracle["overall"] - 30
    # Both runs answered exactly the same questions.
    for a, b in zip(oracle["records"], dummy["records"]):
        assert (a["episode_id"], a["scene_id"], a["question"], a["ground_truth"]) == (
            b["episode_id"],
            b["scene_id"],
            b["question"],
            b["ground_truth"],
        )


def test_dummy_answers_are_uniform_so_its_expected_score_is_chance():
    agent = evaluation.DummyAgent(seed=0)
    options = ["A. left", "B. right", "C. back", "D. front"]
    letters = [agent.random_answer("route_planning", options) for _ in range(4000)]
    freq = {L: letters.count(L) / 4000 for L in "ABCD"}
    assert set(letters) == set("ABCD")
    assert all(abs(f - 0.25) < 0.03 for f in freq.values())  # 4.4 standard deviations
    assert np.mean([score_prediction("route_planning", L, "B") for L in letters]) == pytest.approx(
        0.25, abs=0.03
    )  # B's share: 4.4 sd
    counts = [agent.random_answer("object_counting", None) for _ in range(600)]
    assert {int(c) for c in counts} == set(range(1, 7)) and all(c.isdigit() for c in counts)
    sizes = np.array([float(agent.random_answer("object_size_estimation", None)) for _ in range(2000)])
    assert 20 <= sizes.min() and sizes.max() <= 250 and abs(sizes.mean() - 135) < 5


def test_results_do_not_depend_on_the_batch_size():
    cfg = _cfg("--eval.num_episodes", "4")
    specs = evaluation.procedural_specs(cfg)
    env_cfg = evaluation.eval_env_config(cfg)
    for make_agent in (OracleTeacher, lambda: evaluation.DummyAgent(seed=3)):
        one = evaluation.run_episodes(make_agent(), specs, env_cfg, batch_size=1, progress=False)
        three = evaluation.run_episodes(make_agent(), specs, env_cfg, batch_size=3, progress=False)
        assert [r.to_dict() for r in one.records] == [r.to_dict() for r in three.records]
        assert len(one.records) == 4


def test_vsibench_rows_with_a_missing_scan_are_skipped_and_reported(tmp_path):
    from a2c_ppo_acktr.envs.procedural import make_procedural_scene

    write_arkit_scan(tmp_path / "scans", "41069025", make_procedural_scene(0))
    base = {"dataset": "arkitscenes", "scene_name": "41069025", "options": None}
    rows = [
        {
            **base,
            "id": 3,
            "question_type": "room_size_estimation",
            "question": "What is the size of this room (in square meters)?",
            "ground_truth": "20.5",
        },
        {
            **base,
            "id": 4,
            "scene_name": "99999999",
            "question_type": "object_counting",
            "question": "How many chair(s) are in this room?",
            "ground_truth": "2",
        },
        {
            **base,
            "id": 5,
            "question_type": "route_planning",
            "question": "Which way?",
            "options": ["A. left", "B. right"],
            "ground_truth": "B",
        },
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert (
        eval_vsi.main(
            [*SMALL, "--oracle", "--vsibench", str(path), "--data-root", str(tmp_path / "scans"), "--out", str(out)]
        )
        == 0
    )
    rep = json.loads((out / "report.json").read_text())
    assert [r["episode_id"] for r in rep["records"]] == ["vsibench-3", "vsibench-5"]
    assert [r["score"] for r in rep["records"]] == [1.0, 1.0]
    assert rep["meta"]["num_skipped"] == 1 and "99999999" in rep["meta"]["skipped"][0]["reason"]
    assert rep["meta"]["question_set"] == "vsibench"
    assert "1 question(s) skipped" in (out / "report.md").read_text()
    # Nothing available at all is an error, not an empty report.
    (tmp_path / "empty").mkdir()
    with pytest.raises(RuntimeError, match="no episode could be evaluated"):
        eval_vsi.main(
            [
                *SMALL,
                "--dummy",
                "--vsibench",
                str(path),
                "--data-root",
                str(tmp_path / "empty"),
                "--out",
                str(tmp_path / "none"),
            ]
        )


class _FakePolicy:
    """Records what the agent asks for."""

    def __init__(self):
        self.calls = []

    def act(self, observations, greedy=False, blind=False, temperature=None):
        self.calls.append({"n": len(observations), "greedy": greedy, "blind": blind, "temperature": temperature})
        return type("Out", (), {"texts": ["x"] * len(observations)})()


def test_policy_agent_passes_blind_and_sampling_temperature():
    policy = _FakePolicy()
    obs = [{"images": [], "text": "q"}] * 2
    assert evaluation.PolicyAgent(policy, greedy=True, blind=True).act(obs, [None, None]) == ["x", "x"]
    evaluation.PolicyAgent(policy, greedy=False, temperature=0.3).act(obs, [None, None])
    assert policy.calls[0] == {"n": 2, "greedy": True, "blind": True, "temperature": None}
    assert policy.calls[1] == {"n": 2, "greedy": False, "blind": False, "temperature": 0.3}


def test_score_file_and_compare_through_the_cli(tmp_path, capsys):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"question_type": "object_counting", "prediction": "3", "ground_truth": "3"})
        + "\n"
        + "oops\n"
        + json.dumps({"question_type": "route_planning", "prediction": "A.", "ground_truth": "B"})
        + "\n"
    )
    assert eval_vsi.main(["--score-file", str(preds), "--out", str(tmp_path / "s")]) == 0
    rep = json.loads((tmp_path / "s" / "report.json").read_text())
    assert rep["overall"] == pytest.approx(50.0) and rep["per_type"] == {"object_counting": 1.0, "route_planning": 0.0}
    assert rep["malformed"]["lines"][0]["line"] == 2 and rep["counts"]["malformed"] == 1
    assert "malformed" in capsys.readouterr().err
    assert (
        eval_vsi.main(
            [
                "--compare",
                str(tmp_path / "s" / "report.json"),
                str(tmp_path / "s"),
                "--names",
                "a",
                "b",
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    assert "| a | 50.0 |" in (tmp_path / "c" / "compare.md").read_text()
    with pytest.raises(SystemExit):  # --score-file and --dummy are exclusive
        eval_vsi.main(["--score-file", str(preds), "--dummy", "--out", str(tmp_path / "x")])


def test_mode_words_parse_as_the_flags_they_stand_for(tmp_path):
    """Each mode word of eval_vsi.py gives the namespace of the flags it stands for, and the flag
    forms still parse (a command line that starts with a flag is left as it is)."""
    pairs = [
        (["oracle", "--out", "o"], ["--oracle", "--out", "o"]),
        (["dummy", "--preset", "cpu-demo", "--out", "o"], ["--dummy", "--preset", "cpu-demo", "--out", "o"]),
        (["score", "p.jsonl", "--out", "o"], ["--score-file", "p.jsonl", "--out", "o"]),
        (
            ["compare", "a.json", "b.json", "--paired", "x", "y", "--out", "o"],
            ["--compare", "a.json", "b.json", "--paired", "x", "y", "--out", "o"],
        ),
        (
            ["video", "--vsibench", "r.parquet", "--video-root", "v", "--out", "o"],
            ["--protocol", "video", "--vsibench", "r.parquet", "--video-root", "v", "--out", "o"],
        ),
        (
            ["curves", "m.jsonl", "--smooth", "0.6", "--out", "o"],
            ["--metrics", "m.jsonl", "--smooth", "0.6", "--out", "o"],
        ),
        (
            ["policy", "--checkpoint", "c", "--env.max_turns", "3", "--out", "o"],
            ["--checkpoint", "c", "--env.max_turns", "3", "--out", "o"],
        ),
    ]
    parser = eval_vsi.build_parser()
    for words, flags in pairs:
        assert eval_vsi.expand_mode(words) == flags
        assert parser.parse_known_args(eval_vsi.expand_mode(words)) == parser.parse_known_args(flags)
    assert set(eval_vsi.MODES) == {w[0] for w, _ in pairs}  # every mode is checked above
    assert (
        eval_vsi.expand_mode(["--dummy", "--out", "o"]) == ["--dummy", "--out", "o"] and eval_vsi.expand_mode([]) == []
    )
    assert eval_vsi.expand_mode(["compare", "--help"]) == ["--help"]  # help after a mode word is the one help


@pytest.mark.parametrize(
    "argv, message",
    [
        (["evaluate", "--out", "o"], "unknown mode 'evaluate'"),
        (["video", "--protocol", "interactive", "--out", "o"], "drop --protocol"),
        (["score", "--out", "o"], "score takes a file first"),
        (["compare", "--out", "o"], "compare takes report.json files first"),
        (["policy", "--oracle", "--out", "o"], "--oracle is a mode of its own"),
        (["oracle", "--dummy", "--out", "o"], "not allowed with argument"),
    ],
)
def test_a_wrong_mode_line_is_one_usage_error(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        eval_vsi.main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_every_documented_eval_command_parses():
    """The ``python eval_vsi.py ...`` lines of the README and docs/ (continuation lines joined) parse:
    a known mode word or flag first, known flags, and the checks main() makes before it runs."""
    import re
    import shlex

    from a2c_ppo_acktr.config.cli import check_flag_typos

    repo = Path(__file__).resolve().parent.parent
    commands = []
    for doc in [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        commands += [(doc.name, m.group(1)) for m in re.finditer(r"^\s*python eval_vsi\.py (.+)$", text, re.M)]
    assert len(commands) >= 15
    parser = eval_vsi.build_parser()
    for doc, line in commands:
        argv = eval_vsi.expand_mode(shlex.split(line.split("  #")[0]))
        args, extra = parser.parse_known_args(argv)
        check_flag_typos(parser, extra)
        assert args.out, f"{doc}: {line}"


def test_score_and_compare_modes_write_what_their_flags_write(tmp_path):
    preds = tmp_path / "preds.jsonl"
    preds.write_text(
        json.dumps({"question_type": "object_counting", "prediction": "3", "ground_truth": "3"})
        + "\n"
        + json.dumps({"question_type": "route_planning", "prediction": "A.", "ground_truth": "B"})
        + "\n"
    )
    assert eval_vsi.main(["score", str(preds), "--out", str(tmp_path / "word"), "--name", "p"]) == 0
    assert eval_vsi.main(["--score-file", str(preds), "--out", str(tmp_path / "flag"), "--name", "p"]) == 0
    assert (tmp_path / "word" / "report.md").read_text() == (tmp_path / "flag" / "report.md").read_text()
    assert (
        eval_vsi.main(
            [
                "compare",
                str(tmp_path / "word" / "report.json"),
                str(tmp_path / "flag" / "report.json"),
                "--names",
                "w",
                "f",
                "--out",
                str(tmp_path / "c"),
            ]
        )
        == 0
    )
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| w | 50.0 |" in table and "| f | 50.0 |" in table


def test_checkpoint_loads_adapter_and_heads_and_evaluates(tmp_path):
    import torch

    cfg = _cfg()
    ckpt, trained = perturbed_checkpoint(tmp_path, cfg, scale=0.05, step=2)
    want = {n: p.detach().clone() for n, p in trained.named_parameters() if p.requires_grad}
    assert any("lora_" in n for n in want) and any(n.startswith("value_head") for n in want)
    del trained

    loaded = evaluation.load_policy(cfg, checkpoint=str(ckpt))
    got = {n: p.detach() for n, p in loaded.named_parameters() if p.requires_grad}
    assert set(got) == set(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], msg=n)
    del loaded

    out = tmp_path / "eval"
    # One short episode (the first generate on CPU costs seconds of warm-up; this test proves loading, not quality).
    # No preset and no env flags: the checkpoint's own env (32 px, 4 sweep frames, 3 turns), not the defaults'.
    fast = [
        "--eval.num_episodes",
        "1",
        "--eval.batch_size",
        "1",
        "--log.progress_bar",
        "false",
        "--model.max_new_tokens",
        "8",
    ]
    assert eval_vsi.main(["--checkpoint", str(ckpt), *fast, "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["name"] == "checkpoint-000002" and rep["meta"]["checkpoint"] == str(ckpt)
    assert len(rep["records"]) == 1 and 1 <= rep["records"][0]["turns"] <= cfg.env.max_turns
    assert (out / "trajectories" / "proc-0000.png").is_file()
    assert RunConfig.from_yaml(out / "config.yaml").env == cfg.env  # the config the evaluation ran with


def test_a_checkpoint_is_evaluated_on_its_own_env_and_each_override_is_warned(tmp_path, caplog, capsys):
    """Without --preset the env is the checkpoint's; a preset, a config file, --vsibench/--data-root
    and --env.* overrides change it, and one warning names each changed field and what changed it."""
    import yaml

    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint-000003"
    ckpt.mkdir(parents=True)
    trained = load_config(
        preset="debug",
        overrides=[
            "--env.image_size",
            "48",
            "--env.max_turns",
            "4",
            "--env.num_sweep_frames",
            "4",
            "--env.fov_deg",
            "75",
            "--model.lora_r",
            "2",
        ],
    )
    trained.save(ckpt / "config.yaml")

    def resolve(*argv):
        args, extra = eval_vsi.build_parser().parse_known_args([*argv, "--checkpoint", str(ckpt), "--out", "o"])
        caplog.clear()
        with caplog.at_level("INFO", logger="a2c_ppo_acktr.eval.evaluation"):
            cfg = evaluation.resolve_config(args, extra)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert len(warnings) <= 1
        return cfg, [line.strip() for line in warnings[0].splitlines()[1:]] if warnings else []

    # Nothing given: the checkpoint's env whole (not the defaults' 224 px and 10 turns), its model, no warning.
    cfg, changed = resolve()
    assert cfg.env == trained.env and cfg.model.lora_r == 2 and changed == []
    assert "on the env it was trained on" in caplog.text
    # The preset's env keys and the overrides win over the checkpoint's; the other keys stay the checkpoint's.
    cfg, changed = resolve("--preset", "debug", "--env.image_size", "64", "env.look=flat")
    assert (cfg.env.image_size, cfg.env.fov_deg, cfg.env.num_sweep_frames, cfg.env.max_turns, cfg.env.look) == (
        64,
        75.0,
        2,
        3,
        "flat",
    )
    assert changed == [
        "env.image_size: checkpoint 48 -> 64 (override)",
        "env.num_sweep_frames: checkpoint 4 -> 2 (preset debug)",
        "env.max_turns: checkpoint 4 -> 3 (preset debug)",
        "env.look: checkpoint shaded -> flat (override)",
    ]
    (tmp_path / "c.yaml").write_text("env:\n  eye_height: 1.2\n")
    cfg, changed = resolve("--config", str(tmp_path / "c.yaml"), "--vsibench", "rows.jsonl", "--data-root", "scans")
    assert changed == [
        "env.scene_source: checkpoint procedural -> vsibench (--vsibench)",
        "env.data_root: checkpoint null -> scans (--data-root)",
        "env.vsibench_path: checkpoint null -> rows.jsonl (--vsibench)",
        f"env.eye_height: checkpoint 1.5 -> 1.2 (--config {tmp_path / 'c.yaml'})",
    ]
    # The same resolution through the command line: --print-config shows the env that would be evaluated.
    with pytest.raises(SystemExit) as exit_info:
        eval_vsi.main(["--checkpoint", str(ckpt), "--print-config"])
    assert exit_info.value.code == 0
    assert RunConfig.from_dict(yaml.safe_load(capsys.readouterr().out)).env == trained.env
    # A checkpoint without any config.yaml: the preset/defaults, with a warning that says so.
    bare = tmp_path / "bare" / "checkpoint-000001"
    bare.mkdir(parents=True)
    args, extra = eval_vsi.build_parser().parse_known_args(["--checkpoint", str(bare), "--out", "o"])
    caplog.clear()
    with caplog.at_level("WARNING", logger="a2c_ppo_acktr.eval.evaluation"):
        assert evaluation.resolve_config(args, extra).env == EnvConfig()
    assert "has no config.yaml" in caplog.text
    with pytest.raises(FileNotFoundError, match="no config.yaml found"):
        evaluation.checkpoint_config(bare)
    assert evaluation.checkpoint_config(ckpt) == dataclasses.replace(
        trained, model=dataclasses.replace(trained.model, sft_adapter=None)
    )


def test_flags_and_checkpoint_config_resolve_into_the_run_config(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint-000004"
    ckpt.mkdir(parents=True)
    trained = _cfg("--model.lora_r", "2", "--model.lora_alpha", "4", "--model.sft_adapter", str(tmp_path / "sft"))
    trained.save(ckpt / "config.yaml")
    args = eval_vsi.build_parser().parse_args(
        [
            "--preset",
            "debug",
            "--checkpoint",
            str(ckpt),
            "--blind",
            "--vsibench",
            "rows.jsonl",
            "--data-root",
            "scans",
            "--out",
            "o",
        ]
    )
    cfg = evaluation.resolve_config(args, ["--model.lora_alpha", "6"])
    # The checkpoint's model section (rank 2) with its SFT warm start dropped; the command line wins (alpha 6).
    assert (cfg.model.lora_r, cfg.model.lora_alpha, cfg.model.sft_adapter) == (2, 6, None)
    assert cfg.eval.blind and cfg.env.scene_source == "vsibench"
    assert (cfg.env.vsibench_path, cfg.env.data_root) == ("rows.jsonl", "scans")
    with pytest.raises(FileNotFoundError, match="checkpoint"):
        evaluation.checkpoint_model_config(tmp_path / "missing")


def test_a_checkpoint_trained_at_a_fixed_temperature_evaluates_under_a_preset_that_trains_one(tmp_path):
    """cpu-demo trains a temperature head (ppo.temperature_loss=entropy_target); a run that turned the
    head off (and used grouped RLOO) is still evaluated with --preset cpu-demo: the checkpoint's own
    training sections come with its model, so the preset's do not contradict it."""
    ckpt = tmp_path / "run" / "checkpoints" / "checkpoint-000002"
    ckpt.mkdir(parents=True)
    trained = load_config(
        preset="cpu-demo",
        overrides=[
            "--model.use_temp_predictor", "false", "--ppo.temperature_loss", "policy_gradient",
            "--rollout.group_size", "4", "--ppo.advantage_estimator", "rloo",
        ],
    )  # fmt: skip
    trained.save(ckpt / "config.yaml")
    args, extra = eval_vsi.build_parser().parse_known_args(
        ["--preset", "cpu-demo", "--checkpoint", str(ckpt), "--out", "o", "--ppo.lr", "3e-4"]
    )
    cfg = evaluation.resolve_config(args, extra)
    assert not cfg.model.use_temp_predictor and cfg.ppo.temperature_loss == "policy_gradient"
    assert (cfg.ppo.advantage_estimator, cfg.rollout.group_size, cfg.ppo.lr) == ("rloo", 4, 3e-4)


def test_compare_paired_through_the_cli(runs, tmp_path):
    """Oracle minus dummy on the same 10 questions: the paired difference is the difference of overalls."""
    paths = [str(runs["oracle"] / "report.json"), str(runs["dummy"] / "report.json")]
    assert eval_vsi.main(["--compare", *paths, "--paired", "oracle", "dummy", "--out", str(tmp_path / "c")]) == 0
    md = (tmp_path / "c" / "compare.md").read_text()
    oracle, dummy = (json.loads(Path(p).read_text()) for p in paths)
    diff = oracle["overall"] - dummy["overall"]
    assert f"| oracle - dummy | 10 | {diff:+.1f} | [" in md
    # One question fewer on one side: a clear error, not a silently smaller pairing.
    dummy["records"] = dummy["records"][:-1]
    (tmp_path / "short").mkdir()
    (tmp_path / "short" / "report.json").write_text(json.dumps(dummy))
    with pytest.raises(ValueError, match="not evaluated on the same questions"):
        eval_vsi.main(
            [
                "--compare",
                paths[0],
                str(tmp_path / "short"),
                "--paired",
                "oracle",
                "dummy",
                "--out",
                str(tmp_path / "d"),
            ]
        )
    with pytest.raises(SystemExit):  # --paired needs --compare
        eval_vsi.main(["--dummy", "--paired", "a", "b", "--out", str(tmp_path / "e")])


def test_a_scan_that_fails_to_load_in_any_way_is_skipped_and_reported(caplog):
    """VSI-Bench evaluation: a scan whose loading raises anything (not only SceneLoadError) skips its
    questions with the reason, once per scan, and the evaluation goes on."""
    from a2c_ppo_acktr.eval.evaluation import EpisodeSpec, _reset

    class Broken:
        calls = 0

        def reset(self, seed=None, options=None):
            Broken.calls += 1
            raise IndexError("index 7 is out of bounds")

    failed: dict = {}
    spec = EpisodeSpec("vsibench-1", 0, "room_size_estimation", 0, ("scannet", "scene0001_00"))
    with caplog.at_level("WARNING"):
        obs, reason = _reset(Broken(), spec, failed)
        again = _reset(Broken(), spec, failed)
    assert obs == {} and "scannet/scene0001_00 failed to load (IndexError: index 7 is out of bounds)" in reason
    assert again == ({}, reason) and Broken.calls == 1 and "questions are skipped" in caplog.text


class _RecordingPolicy:
    """Keeps the observations it is asked about."""

    def __init__(self):
        self.seen = []

    def act(self, observations, greedy=False, blind=False, temperature=None):
        self.seen.append(list(observations))
        return type("Out", (), {"texts": ["x"] * len(observations)})()


def _game_frames(n: int = 2) -> list[dict]:
    rng = np.random.default_rng(0)
    return [
        {
            "images": (
                rng.integers(1, 255, (32, 32, 3), dtype=np.uint8),
                rng.integers(1, 255, (32, 48, 3), dtype=np.uint8),
            ),
            "text": f"q{k}",
        }
        for k in range(n)
    ]


def test_zero_images_twin_sees_zero_pixels_of_the_same_shapes_and_text():
    obs = _game_frames()
    before = [[im.copy() for im in o["images"]] for o in obs]
    policy = _RecordingPolicy()
    evaluation.PolicyAgent(policy, zero_images=True).act(obs, [None, None])
    (seen,) = policy.seen
    for o, s, kept in zip(obs, seen, before):
        assert s["text"] == o["text"]
        assert [im.shape for im in s["images"]] == [im.shape for im in o["images"]]
        assert all(im.dtype == np.uint8 and not im.any() for im in s["images"])
        # The env's own observation is not modified (trajectory pictures still show the frames).
        assert all(np.array_equal(a, b) for a, b in zip(o["images"], kept))
    with pytest.raises(ValueError, match="exclude each other"):
        evaluation.PolicyAgent(policy, blind=True, zero_images=True)


def test_zero_images_twin_has_the_sighted_prompt_tokens_and_only_zero_pixels(tiny_model_path):
    """The twin's processor inputs: the same input ids (placeholders included) and pixel values that
    are the processor's encoding of a black frame, while the sighted pixels differ."""
    import torch

    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.model import VLMPolicy

    policy = VLMPolicy(ModelConfig(model_path=tiny_model_path, device="cpu", dtype="float32"))
    obs = _game_frames()
    sighted = policy._process(*policy._prompts_and_images(obs, blind=False))
    twin = policy._process(*policy._prompts_and_images([evaluation.zeroed_images(o) for o in obs], blind=False))
    assert torch.equal(sighted["input_ids"], twin["input_ids"])
    assert torch.equal(sighted["image_grid_thw"], twin["image_grid_thw"])
    proc = policy.processor.image_processor
    black = (0.0 - torch.tensor(proc.image_mean)) / torch.tensor(proc.image_std)  # per channel
    pixels = twin["pixel_values"].reshape(twin["pixel_values"].shape[0], 3, -1)
    assert torch.allclose(pixels, black.view(1, 3, 1).expand_as(pixels))
    assert not torch.equal(sighted["pixel_values"], twin["pixel_values"])


def test_zero_images_flag_sets_the_config_names_the_row_and_excludes_blind(tmp_path):
    args = eval_vsi.build_parser().parse_args(["--preset", "debug", "--zero-images", "--out", "o"])
    cfg = evaluation.resolve_config(args, [])
    assert cfg.eval.zero_images and not cfg.eval.blind
    assert evaluation.default_name(args, "m", " (zeroed images)") == "m (zeroed images)"
    args = eval_vsi.build_parser().parse_args(["--preset", "debug", "--zero-images", "--blind", "--out", "o"])
    with pytest.raises(Exception, match="eval.blind and eval.zero_images"):
        evaluation.resolve_config(args, [])
