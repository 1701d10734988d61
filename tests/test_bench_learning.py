"""The learning benchmark's pure parts (windows, divergence, CIs over seeds, targets, table, resume) on
synthetic metrics rows: nothing here trains."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from PIL import Image

from a2c_ppo_acktr.common import stats

from bench_helpers import bench_module


@pytest.fixture(scope="module")
def bl():
    yield from bench_module("bench_learning")


def _rows(scores, valid=None, seconds=2.0):
    valid = valid if valid is not None else [1.0] * len(scores)
    return [
        {"iteration": i + 1, "rollout/episode_score_mean": s, "rollout/valid_action_rate": v, "time/iteration": seconds}
        for i, (s, v) in enumerate(zip(scores, valid))
    ]


def test_windows_skip_nan_strings_and_short_runs_use_everything(bl):
    rows = _rows([0.0, "nan", 1.0, None, 0.5] + [0.2] * 10)
    s = bl.series(rows, "rollout/episode_score_mean")
    assert np.isnan(s[1]) and np.isnan(s[3]) and s.shape == (15,)
    assert bl.window_mean(s, first=5) == pytest.approx(0.5)  # (0 + 1 + 0.5) / 3
    assert bl.window_mean(s, last=10) == pytest.approx(0.2)
    short = bl.series(_rows([0.1, 0.3]), "rollout/episode_score_mean")
    assert bl.window_mean(short, last=10) == pytest.approx(0.2)
    assert math.isnan(bl.window_mean(np.array([np.nan, np.nan]), first=5))


def test_divergence_needs_five_consecutive_low_valid_rates(bl):
    assert not bl.diverged(_rows([0.0] * 9, valid=[0.4] * 4 + [0.6] + [0.4] * 4))
    assert bl.diverged(_rows([0.0] * 9, valid=[0.9, 0.4, 0.3, 0.2, 0.1, 0.49, 0.9, 0.9, 0.9]))
    assert not bl.diverged(_rows([0.0] * 6, valid=[0.4, 0.4, "nan", 0.4, 0.4, 0.4]))  # a gap breaks the streak
    assert not bl.diverged(_rows([0.0] * 6, valid=[0.5] * 6))  # 0.5 is not below 0.5


def _result(bl, task, estimator, seed, control, scores, valid=None, wall=10.0, status="ok"):
    return bl.RunResult(
        bl.RunSpec(task, estimator, seed, control), status, _rows(scores, valid) if status == "ok" else [], wall
    )


def test_summary_is_per_seed_window_means_then_a_t_interval_over_seeds(bl):
    # Seed k: first 5 iterations at 0.1 * k, last 10 at 0.4 + 0.1 * k -> last-10 means 0.5, 0.6, 0.7.
    results = [
        _result(bl, "room_size", "gae", k, False, [0.1 * k] * 5 + [0.4 + 0.1 * k] * 10, wall=10.0 * k)
        for k in (1, 2, 3)
    ]
    results.append(_result(bl, "room_size", "gae", 1, True, [0.3] * 15, valid=[0.1] * 15))
    results.append(_result(bl, "room_size", "gae", 2, True, [], status="failed"))
    groups = bl.summarize(results)
    assert [(g["lr"], g["runs"], g["ok"]) for g in groups] == [("run", 3, 3), ("control", 2, 1)]
    run, control = groups
    mean, half, n = run["last_ci"]
    assert (mean, n) == (pytest.approx(0.6), 3)
    assert half == pytest.approx(4.302653 * 0.1 / math.sqrt(3), rel=1e-5)  # t_{0.975,2} * sd / sqrt(n)
    assert run["first_ci"][0] == pytest.approx(0.2) and run["wall_s"] == pytest.approx(20.0)
    assert run["seconds_per_iteration"] == pytest.approx(2.0) and run["diverged"] == 0
    assert (
        control["diverged"] == 1 and control["last_ci"][0] == pytest.approx(0.3) and math.isnan(control["last_ci"][1])
    )
    table = bl.table_markdown(groups, {("room_size", "gae", "run"): bl.target_cell(bl.TASKS["room_size"], run, 0.55)})
    lines = table.splitlines()
    assert lines[0].startswith("| task | estimator | lr | runs ok | first-5 score | last-10 score | diverged |")
    assert lines[2] == (
        f"| room_size | gae | run | 3/3 | 0.200 ± {stats.mean_ci([0.1, 0.2, 0.3])[1]:.3f} | 0.600 ± {half:.3f} | 0 "
        "| 20 | >= best constant 0.550 | yes |"
    )
    assert lines[3] == "| room_size | gae | control (1e-12) | 1/2 | 0.300 | 0.300 | 1 | 10 | - | - |"


def test_targets(bl):
    def group(last):
        return {"last_ci": bl._ci(last)}

    one, room, obj, mix = (bl.TASKS[k] for k in ("one_scene", "room_size", "object_size", "mix"))
    assert bl.target_cell(one, group([0.96, 0.97]), None) == (">= 0.95", "yes")
    assert bl.target_cell(one, group([0.96, 0.90]), None) == (">= 0.95", "no")
    assert bl.target_cell(room, group([0.5]), None) == ("best constant n/a", "n/a")
    assert bl.target_cell(room, group([0.5]), 0.45)[1] == "yes"
    # Mean 0.6 beats 0.5, but with 3 seeds the CI (0.6 +- 0.248) reaches below it.
    assert bl.target_cell(obj, group([0.5, 0.6, 0.7]), 0.5) == ("CI above best constant 0.500", "no")
    assert bl.target_cell(obj, group([0.59, 0.6, 0.61]), 0.5)[1] == "yes"
    assert bl.target_cell(obj, group([0.9]), 0.5)[1] == "n/a (needs 2+ seeds)"
    one_seed = bl.held_out_summary([{"diff": 3.0, "low": 1.0, "high": 5.0}])
    assert bl.target_cell(mix, group([0.3]), None, one_seed) == (
        "PPO - SFT held-out > 0: +3.0 [+1.0, +5.0] (1 seed, bootstrap over questions)",
        "yes",
    )
    seeds = bl.held_out_summary([{"diff": d, "low": 0.0, "high": 0.0} for d in (1.0, 2.0, 3.0)])
    assert seeds["diff"] == pytest.approx(2.0) and seeds["low"] == pytest.approx(
        2.0 - 4.302653 / math.sqrt(3), rel=1e-5
    )
    assert bl.target_cell(mix, group([0.3]), None, seeds)[1] == "no"
    assert bl.target_cell(mix, group([0.3]), None, bl.held_out_summary([]))[1] == "n/a (no eval)"


def test_best_constant_by_hand(bl):
    # Against 10 and 20: answering 10 scores 1.0 and 0.1 (error 0.5 passes one threshold); 20 scores 0
    # and 1; 11 scores 0.9 and 0.1 (error 0.45 > 0.4499...); 14 scores 0.3 and 0.5.
    assert bl.best_constant("room_size_estimation", ["10", "20"]) == (10.0, pytest.approx(0.55))
    assert bl.best_constant("object_size_estimation", ["36", "36", "36"]) == (36.0, 1.0)
    with pytest.raises(ValueError, match="needs ground truths"):
        bl.best_constant("room_size_estimation", [])


def test_commands_add_groups_for_rloo_and_the_control_lr(bl, tmp_path):
    args = bl.build_parser().parse_args(["--out", str(tmp_path), "--extra", "env.image_size=32"])
    ctrl = bl.train_argv(bl.RunSpec("one_scene", "rloo", 2, True), args)
    assert ctrl[1] == "main_vsi.py" and "rollout.group_size=4" in ctrl and ctrl[-2:] == ["--ppo.lr", "1e-12"]
    assert ctrl[ctrl.index("--seed") + 1] == "2" and "env.num_scenes=1" in ctrl
    assert ctrl.index("env.num_scenes=1") < ctrl.index("env.image_size=32")  # --extra comes last, so it wins
    run = bl.train_argv(bl.RunSpec("one_scene", "gae", 2, False), args)
    assert "--ppo.lr" not in run and "rollout.group_size=4" not in run
    assert ctrl[ctrl.index("--log.output_dir") + 1] == str(tmp_path / "one_scene" / "rloo" / "control" / "seed2")
    # rloo/grpo rollouts hold whole episodes: as many steps as the task's env.max_turns (NumberLine 10)
    game = bl.train_argv(bl.RunSpec("numberline", "grpo", 1, False), args)
    assert game[game.index("--rollout.num_steps") + 1] == "10" and "--rollout.num_steps" not in run
    mine = bl.build_parser().parse_args(["--out", str(tmp_path), "--extra", "rollout.num_steps=20"])
    assert "--rollout.num_steps" not in bl.train_argv(bl.RunSpec("numberline", "grpo", 1, False), mine)


def test_missing_adapter_says_to_run_the_quickstart(bl, tmp_path, capsys):
    with pytest.raises(SystemExit):
        bl.main(["--sft-adapter", str(tmp_path / "nope"), "--out", str(tmp_path)])
    assert "bash scripts/quickstart.sh" in capsys.readouterr().err


def test_finished_commands_are_reused_unless_rerun(bl, tmp_path):
    counter = tmp_path / "count"
    argv = [
        sys.executable,
        "-c",
        f"p = {str(counter)!r}; import os; n = int(open(p).read()) if os.path.exists(p) else 0; open(p, "
        "'w').write(str(n + 1))",
    ]
    d = tmp_path / "run"
    done = lambda directory: counter.is_file()  # noqa: E731
    first = bl.run_all([(d, argv)], jobs=1, rerun=False, complete=done)
    assert first[d]["returncode"] == 0 and counter.read_text() == "1"
    assert json.loads((d / bl.MARKER).read_text())["argv"] == argv
    bl.run_all([(d, argv)], jobs=1, rerun=False, complete=done)
    assert counter.read_text() == "1"  # reused
    bl.run_all([(d, argv + ["x"])], jobs=1, rerun=False, complete=done)
    assert counter.read_text() == "2"  # another command is not the same run
    bl.run_all([(d, argv + ["x"])], jobs=1, rerun=True, complete=done)
    assert counter.read_text() == "3"
    failing = bl.run_all(
        [(tmp_path / "bad", [sys.executable, "-c", "raise SystemExit(3)"])], jobs=2, rerun=False, complete=done
    )
    assert failing[tmp_path / "bad"]["returncode"] == 3


def test_curves_png(bl, tmp_path):
    results = [
        _result(bl, t, "gae", k, c, list(np.linspace(0.1, 0.2 * k, 12)))
        for t in ("one_scene", "mix")
        for k in (1, 2)
        for c in (False, True)
    ]
    path = bl.plot_curves(results, ["one_scene", "mix"], ["gae", "rloo"], tmp_path / "c.png", {"one_scene": 0.95})
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size == (1200, 400)


def test_greedy_held_out_scores_the_constant_on_the_same_questions(bl, tmp_path, monkeypatch):
    """Per seed the eval report's overall (points -> fraction); the best constant answer scored by hand
    on the report's own ground truths (MRA of 100 vs 100 = 1, vs 200 = 0.5 at thresholds .50-.95)."""
    from a2c_ppo_acktr.common.scoring import score_prediction

    args = bl.parse_args(
        [
            "--tasks",
            "object_size",
            "--estimators",
            "gae",
            "--seeds",
            "2",
            "--out",
            str(tmp_path),
            "--sft-adapter",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
        ]
    )
    results = [bl.RunResult(bl.RunSpec("object_size", "gae", s, False), "ok") for s in (1, 2)]
    records = [{"question_type": "object_size_estimation", "ground_truth": g, "answer": "150"} for g in ("100", "200")]
    for r, overall in zip(results, (40.0, 50.0)):
        d = r.spec.directory(tmp_path)
        (d / "checkpoints" / "checkpoint-000002").mkdir(parents=True)
        (d / "checkpoints" / "checkpoint-000002" / "COMPLETE").write_text("{}")
        (d / "eval_greedy").mkdir()
        (d / "eval_greedy" / "report.json").write_text(
            json.dumps({"overall": overall, "table": [], "records": records})
        )
    calls = []
    monkeypatch.setattr(
        bl, "run_all", lambda jobs, *a, **k: calls.append(jobs) or {d: {"returncode": 0} for d, _ in jobs}
    )
    (line,) = bl.evaluate_greedy(args, results, {"object_size": {"answer": 100.0, "score": 0.7}})
    # Each run is evaluated twice: sighted, and its blind twin with the frames zeroed.
    assert len(calls[0]) == 4 and all("--checkpoint" in argv for _, argv in calls[0])
    assert [("--zero-images" in argv, d.name) for d, argv in calls[0]] == [(False, bl.SIGHTED), (True, bl.ZEROED)] * 2
    const = (
        score_prediction("object_size_estimation", "100", "100")
        + score_prediction("object_size_estimation", "100", "200")
    ) / 2
    assert line["constant"] == pytest.approx(const) and line["scores"] == [0.4, 0.5]
    mean, half = stats.mean_ci([0.4, 0.5])
    assert line["ci"][:2] == pytest.approx((mean, half))
    assert line["met"] == ("yes" if mean - half > const else "no") and "vs the best constant 100.0" in line["text"]
    assert line["top_answer_share"] == [1.0, 1.0] and "near-constant policy" in line["text"]
    assert bl.top_answer_share([{"answer": "1"}, {"answer": "2"}, {"answer": "2"}, {"answer": None}]) == 0.5


def test_object_size_builds_its_own_embedding_lora_sft_adapter(bl, tmp_path, monkeypatch):
    """object_size (target c) starts from an adapter the bench trains on its own questions, with LoRA on
    the input embeddings (cpu-demo's targets + embed_tokens); ``--adapter`` skips the stage."""
    import shlex

    from a2c_ppo_acktr.config.arguments import load_config

    targets = load_config(preset=bl.PRESET).model.lora_target_modules
    assert bl.EMBEDDING_LORA == f"model.lora_target_modules={targets}|.*language_model\\.embed_tokens"
    args = bl.parse_args(
        [
            "--tasks",
            "object_size",
            "--sft-adapter",
            str(tmp_path / "none"),
            "--model-path",
            str(tmp_path),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    task = bl.TASKS["object_size"]
    adapter = tmp_path / "o" / "object_size" / "sft" / "train" / "adapter"
    assert bl.task_adapter(args, task) == adapter
    run = bl.train_argv(bl.RunSpec("object_size", "gae", 1, False), args)
    assert run[run.index("--sft-adapter") + 1] == str(adapter) and bl.EMBEDDING_LORA in run
    stage = bl.sft_stage_argv(args, task)
    assert stage[:2] == ["bash", "-c"]
    steps = [shlex.split(s) for s in stage[2].removeprefix("set -e; ").split("; ")]
    assert [s[1] for s in steps] == ["vlm_traj_label.py", "vlm_traj_preprocess.py", "train_sft.py"]
    for s in steps:  # every step sees the task's questions, its LoRA targets and its own recipe
        assert {
            "env.question_types=[object_size_estimation]",
            bl.EMBEDDING_LORA,
            "label.num_episodes=400",
            "sft.lr=1e-3",
        } <= set(s)
    assert steps[2][steps[2].index("--sft.output_dir") + 1] == str(adapter.parent)

    calls = tmp_path / "calls"
    fake = [
        sys.executable,
        "-c",
        f"import pathlib; open({str(calls)!r}, 'a').write('x'); p = pathlib.Path({str(adapter)!r}); "
        "p.mkdir(parents=True, exist_ok=True); (p / 'adapter_config.json').write_text('{}')",
    ]
    monkeypatch.setattr(bl, "sft_stage_argv", lambda a, t: fake)
    bl.build_task_adapters(args)
    bl.build_task_adapters(args)
    assert calls.read_text() == "x"  # built once, then reused
    given = bl.parse_args(
        [
            "--tasks",
            "object_size",
            "--adapter",
            f"object_size={tmp_path}",
            "--model-path",
            str(tmp_path),
            "--out",
            str(tmp_path / "g"),
        ]
    )
    bl.build_task_adapters(given)
    assert calls.read_text() == "x" and bl.task_adapter(given, task) == tmp_path
    monkeypatch.setattr(bl, "sft_stage_argv", lambda a, t: [sys.executable, "-c", "raise SystemExit(2)"])
    with pytest.raises(RuntimeError, match="SFT stage failed"):
        bl.build_task_adapters(
            bl.parse_args(["--tasks", "object_size", "--model-path", str(tmp_path), "--out", str(tmp_path / "f")])
        )


def test_blind_twin_lines_pair_each_seed_with_its_zeroed_twin(bl, tmp_path):
    """Seed 1 wins 4 of 4 deals sighted and 0 blind (+100 points, CI above 0); seed 2 plays the same
    with and without frames (+0, CI [0, 0]): the line counts 1 of 2 seeds."""
    args = bl.parse_args(
        [
            "--tasks",
            "numberline",
            "--estimators",
            "gae",
            "--seeds",
            "2",
            "--out",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
            "--adapter",
            f"numberline={tmp_path}",
            "--eval-episodes",
            "4",
        ]
    )
    runs = [bl.RunResult(bl.RunSpec("numberline", "gae", s, False), "ok") for s in (1, 2)]

    def report(name, wins):
        recs = [
            {
                "episode_id": f"e{k}",
                "question_type": "numberline",
                "question": "q",
                "ground_truth": "",
                "score": float(w),
            }
            for k, w in enumerate(wins)
        ]
        return {"name": name, "overall": 100.0 * sum(wins) / len(wins), "table": [], "records": recs}

    for r, (sighted, zeroed) in zip(runs, [([1, 1, 1, 1], [0, 0, 0, 0]), ([1, 0, 1, 0], [1, 0, 1, 0])]):
        d = r.spec.directory(tmp_path)
        for sub, wins in ((bl.SIGHTED, sighted), (bl.ZEROED, zeroed)):
            (d / sub).mkdir(parents=True)
            (d / sub / "report.json").write_text(json.dumps(report(sub, wins)))
    (line,) = bl.blind_twin_lines(args, runs)
    assert line["per_seed"][1]["diff"] == pytest.approx(100.0) and line["per_seed"][1]["low"] > 0
    assert (line["per_seed"][2]["diff"], line["per_seed"][2]["low"], line["per_seed"][2]["high"]) == (0.0, 0.0, 0.0)
    assert line["above_zero"] == 1 and "CI above 0 in 1 of 2 seed(s)" in line["text"]


def test_temperature_only_control_trains_the_heads_at_the_runs_rate(bl, tmp_path):
    args = bl.parse_args(
        [
            "--tasks",
            "one_scene",
            "--estimators",
            "gae",
            "--out",
            str(tmp_path),
            "--sft-adapter",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
            "--extra",
            "ppo.lr=3e-4",
        ]
    )
    run = bl.train_argv(bl.RunSpec("one_scene", "gae", 1, False), args)
    plain = bl.train_argv(bl.RunSpec("one_scene", "gae", 1, True), args)
    temp = bl.train_argv(bl.RunSpec("one_scene", "gae", 1, True, temperature_only=True), args)
    assert "--ppo.head_lr" not in run and "--ppo.lr" not in run
    assert plain[-2:] == ["--ppo.lr", bl.CONTROL_LR] and "--ppo.head_lr" not in plain
    assert temp[temp.index("--ppo.head_lr") + 1] == "0.0003" and temp[-2:] == ["--ppo.lr", bl.CONTROL_LR]
    assert (
        bl.RunSpec("one_scene", "gae", 1, True, temperature_only=True).directory(tmp_path).parts[-2] == "temp_control"
    )
    # A run's own head_lr wins over its lr.
    args = bl.parse_args(
        [
            "--tasks",
            "one_scene",
            "--out",
            str(tmp_path),
            "--sft-adapter",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
            "--extra",
            "ppo.head_lr=2e-3",
        ]
    )
    temp = bl.train_argv(bl.RunSpec("one_scene", "gae", 1, True, temperature_only=True), args)
    assert temp[temp.index("--ppo.head_lr") + 1] == "0.002"


def test_game_lines_pair_each_run_with_the_sft_adapter_and_count_the_level(bl, tmp_path, monkeypatch):
    """numberline_headroom: seed 1 wins 4 of 4 where SFT won 1 (+75 points, CI above 0), seed 2 plays as
    SFT (+0): one seed above SFT, and one of two at the 0.95 level."""
    args = bl.parse_args(
        [
            "--tasks",
            "numberline_headroom",
            "--estimators",
            "gae",
            "--seeds",
            "2",
            "--out",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
            "--adapter",
            f"numberline_headroom={tmp_path}",
            "--eval-episodes",
            "4",
        ]
    )
    results = [
        bl.RunResult(bl.RunSpec("numberline_headroom", "gae", s, c), "ok") for s in (1, 2) for c in (False, True)
    ]

    def write(d, wins):
        recs = [
            {
                "episode_id": f"e{k}",
                "question_type": "numberline",
                "question": "q",
                "ground_truth": "",
                "score": float(w),
            }
            for k, w in enumerate(wins)
        ]
        d.mkdir(parents=True, exist_ok=True)
        (d / "report.json").write_text(
            json.dumps(
                {
                    "name": d.name,
                    "kind": "game",
                    "overall": 0.0,
                    "table": [],
                    "records": recs,
                    "agent": {"success_rate": sum(wins) / len(wins)},
                }
            )
        )

    sft = [0, 0, 0, 1]
    write(tmp_path / "numberline_headroom" / "sft_eval", sft)
    write(tmp_path / "numberline_headroom" / "sft_eval_zeroed", [0, 0, 0, 0])
    for r in results:
        d = r.spec.directory(tmp_path)
        (d / "checkpoints" / "checkpoint-000002").mkdir(parents=True)
        (d / "checkpoints" / "checkpoint-000002" / "COMPLETE").write_text("{}")
        wins = sft if r.spec.control else {1: [1, 1, 1, 1], 2: sft}[r.spec.seed]
        write(d / bl.SIGHTED, wins)
        write(d / bl.ZEROED, [0, 0, 0, 0])
    monkeypatch.setattr(bl, "run_all", lambda jobs, *a, **k: {d: {"returncode": 0} for d, _ in jobs})
    (line,) = bl.evaluate_games(args, results)
    assert line["run"] == {1: 1.0, 2: 0.25} and line["control"] == {1: 0.25, 2: 0.25} and line["sft"] == 0.25
    assert line["vs_sft"][1]["diff"] == pytest.approx(75.0) and line["vs_sft"][1]["low"] > 0
    assert line["vs_sft"][2]["diff"] == 0.0 and line["vs_sft_above_zero"] == 1 and line["level_met"] == 1
    assert line["sft_twin"]["diff"] == pytest.approx(25.0)
    assert "CI above 0 in 1 of 2 seed(s)" in line["text"] and "greedy success >= 0.95 in 1 of 2 seed(s)" in line["text"]


def test_mix_held_out_evaluates_a_zeroed_twin_of_the_sft_adapter_and_every_run(bl, tmp_path, monkeypatch):
    args = bl.parse_args(
        [
            "--tasks",
            "mix",
            "--estimators",
            "gae",
            "--seeds",
            "1",
            "--out",
            str(tmp_path),
            "--sft-adapter",
            str(tmp_path),
            "--model-path",
            str(tmp_path),
            "--eval-episodes",
            "2",
        ]
    )
    run = bl.RunResult(bl.RunSpec("mix", "gae", 1, False), "ok")
    d = run.spec.directory(tmp_path)
    (d / "checkpoints" / "checkpoint-000002").mkdir(parents=True)
    (d / "checkpoints" / "checkpoint-000002" / "COMPLETE").write_text("{}")
    recs = [
        {
            "episode_id": f"e{k}",
            "question_type": "room_size_estimation",
            "question": "q",
            "ground_truth": "10",
            "score": s,
        }
        for k, s in enumerate((1.0, 0.5))
    ]
    for where in (
        tmp_path / "mix" / "sft_eval",
        tmp_path / "mix" / "sft_eval_zeroed",
        d / bl.HELD_OUT_SIGHTED,
        d / bl.HELD_OUT_ZEROED,
    ):
        where.mkdir(parents=True)
        blind = "zeroed" in where.name
        (where / "report.json").write_text(
            json.dumps(
                {
                    "name": where.name,
                    "overall": 0.0,
                    "table": [],
                    "records": [{**r, "score": 0.0 if blind else r["score"]} for r in recs],
                }
            )
        )
    calls = []
    monkeypatch.setattr(
        bl, "run_all", lambda jobs, *a, **k: calls.append(jobs) or {p: {"returncode": 0} for p, _ in jobs}
    )
    bl.evaluate_held_out(args, [run])
    assert sorted((p.name, "--zero-images" in argv) for p, argv in calls[0]) == [
        ("eval", False),
        ("eval_zeroed", True),
        ("sft_eval", False),
        ("sft_eval_zeroed", True),
    ]
    (line,) = bl.blind_twin_lines(args, [run])
    assert line["per_seed"][1]["diff"] == pytest.approx(75.0)  # Overall 75 sighted against 0 with zeroed frames


def test_a_held_out_task_with_its_own_sft_stage_is_judged_against_that_adapter_per_seed(
    bl, tmp_path, monkeypatch, capsys
):
    """``room_size_headroom``: its SFT start is the adapter of its own stage (or ``--adapter``), not
    ``--sft-adapter``; each seed's run - SFT is a paired CI, counted where it excludes 0."""
    own = tmp_path / "own_adapter"
    own.mkdir()
    args = bl.parse_args(
        [
            "--tasks",
            "room_size_headroom",
            "--estimators",
            "gae",
            "--seeds",
            "2",
            "--out",
            str(tmp_path),
            "--sft-adapter",
            str(tmp_path / "quickstart_adapter"),
            "--model-path",
            str(tmp_path),
            "--eval-episodes",
            "3",
            "--adapter",
            f"room_size_headroom={own}",
        ]
    )
    runs = [bl.RunResult(bl.RunSpec("room_size_headroom", "gae", seed, False), "ok") for seed in (1, 2)]
    sft_scores, run_scores = (0.2, 0.2, 0.2), {1: (0.9, 0.8, 0.9), 2: (0.2, 0.2, 0.2)}
    reports = {
        tmp_path / "room_size_headroom" / "sft_eval": sft_scores,
        tmp_path / "room_size_headroom" / "sft_eval_zeroed": (0.0,) * 3,
    }
    for r in runs:
        d = r.spec.directory(tmp_path)
        (d / "checkpoints" / "checkpoint-000002").mkdir(parents=True)
        (d / "checkpoints" / "checkpoint-000002" / "COMPLETE").write_text("{}")
        reports[d / bl.HELD_OUT_SIGHTED] = run_scores[r.spec.seed]
        reports[d / bl.HELD_OUT_ZEROED] = (0.0,) * 3
    for where, scores in reports.items():
        where.mkdir(parents=True)
        recs = [
            {
                "episode_id": f"e{k}",
                "question_type": "room_size_estimation",
                "question": "q",
                "ground_truth": "10",
                "score": v,
            }
            for k, v in enumerate(scores)
        ]
        (where / "report.json").write_text(
            json.dumps({"name": where.name, "overall": 100 * sum(scores) / 3, "table": [], "records": recs})
        )
    calls = []
    monkeypatch.setattr(
        bl, "run_all", lambda jobs, *a, **k: calls.append(jobs) or {p: {"returncode": 0} for p, _ in jobs}
    )
    held = bl.evaluate_held_out(args, runs)
    sft_argv = dict(calls[0])[tmp_path / "room_size_headroom" / "sft_eval"]
    assert sft_argv[sft_argv.index("--adapter") + 1] == str(own)
    (line,) = bl.held_out_lines(args, held)
    assert (
        "seed 1 +66.7 [" in line
        and "seed 2 +0.0 [+0.0, +0.0]" in line
        and line.endswith("CI above 0 in 1 of 2 seed(s)")
    )
    with pytest.raises(SystemExit):  # two held-out tasks are refused before any run, not after hours of them
        bl.parse_args(
            [
                "--tasks",
                "room_size_headroom",
                "mix",
                "--sft-adapter",
                str(own),
                "--model-path",
                str(tmp_path),
                "--adapter",
                f"room_size_headroom={own}",
            ]
        )
    assert "share one set of per-seed differences" in capsys.readouterr().err


def test_eval_policy_best_judges_the_policy_validation_kept(bl, tmp_path):
    """``--eval-policy best``: the greedy evaluations load ``<run>/best/policy`` (as an adapter), the
    last checkpoint otherwise; a run without validation's best policy is an error naming the fix."""
    common = [
        "--tasks",
        "numberline_headroom",
        "--estimators",
        "gae",
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
        "--model-path",
        str(tmp_path),
        "--adapter",
        f"numberline_headroom={tmp_path}",
    ]
    last, best = bl.parse_args(common), bl.parse_args([*common, "--eval-policy", "best"])
    runs = [bl.RunResult(bl.RunSpec("numberline_headroom", "gae", s, False), "ok") for s in (1, 2)]
    for r in runs:
        d = r.spec.directory(tmp_path)
        (d / "checkpoints" / "checkpoint-000004").mkdir(parents=True)
        (d / "checkpoints" / "checkpoint-000004" / "COMPLETE").write_text("{}")
    (runs[0].spec.directory(tmp_path) / "best" / "policy").mkdir(parents=True)

    def policy_args(args, run):
        (sighted, argv), (zeroed, twin) = bl.greedy_eval_jobs(args, [run])
        assert twin[:-5] == argv[:-4] and "--zero-images" in twin  # the twin judges the same policy
        i = argv.index("--name")
        return argv[i - 2 : i]

    d1 = runs[0].spec.directory(tmp_path)
    assert policy_args(last, runs[0]) == ["--checkpoint", str(d1 / "checkpoints" / "checkpoint-000004")]
    assert policy_args(best, runs[0]) == ["--adapter", str(d1 / "best" / "policy")]
    with pytest.raises(FileNotFoundError, match="log.val_interval"):
        bl.greedy_eval_jobs(best, [runs[1]])
