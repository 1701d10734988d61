"""Where a command promises one line and exit 2, a user's mistake or a damaged file gives exactly that,
never a traceback: odd things at the paths a run uses (a lock file or STOP that is a directory,
``metrics.jsonl`` as a directory, ``par/child/..``, a name that is not UTF-8), settings that cannot
work together (debug's frames under NumberLine's minimum), wrong inputs (``--data-root``, a malformed
saved rollout, a truncated adapter, a checkpoint whose marker checks nothing or whose state is
damaged), reports that cannot be compared or plotted, the gallery's arguments and a full disk."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.config.cli import run_main

from helpers import one_line_error as _one_line

REPO = Path(__file__).resolve().parent.parent


def _exit_code(main) -> int:
    """``run_main``'s code, or argparse's (its errors exit 2 through SystemExit)."""
    try:
        return run_main(main, "prog")
    except SystemExit as e:
        return int(e.code)


def _ppo_cfg(out, **extra: str):
    base = {
        "log.output_dir": str(out),
        "log.progress_bar": "false",
        "log.tensorboard": "false",
        "log.save_interval": "1",
        "ppo.num_iterations": "2",
        "env.max_turns": "2",
        "model.max_new_tokens": "24",
    }
    base.update(extra)
    return load_config(preset="debug", overrides=[f"{k}={v}" for k, v in base.items()])


def _train(out, **extra: str):
    from a2c_ppo_acktr.rl.train import run_training

    return lambda: run_training(_ppo_cfg(out, **extra))


# ------------------------------------------------------------------------ paths a run uses
def test_a_lock_file_that_is_a_directory_is_one_line(tmp_path, capsys):
    (tmp_path / ".run.lock").mkdir()
    _one_line(capsys, run_main(_train(tmp_path / "run"), "main_vsi.py"), ".run.lock of", "is a directory", "rmdir")
    (tmp_path / ".e.lock").mkdir()
    import eval_vsi

    rc = run_main(lambda: eval_vsi.main(["--preset", "debug", "--dummy", "--out", str(tmp_path / "e")]), "eval_vsi.py")
    _one_line(capsys, rc, ".e.lock of", "is a directory")


def test_a_stop_request_that_is_a_directory_stops_the_run_or_is_one_line(tmp_path, capsys):
    from a2c_ppo_acktr.run.preemption import StopOnSignal, remove_stop_file

    run = tmp_path / "run"
    (run / "STOP" / "inside").mkdir(parents=True)  # cannot be removed without losing what it holds
    _one_line(capsys, run_main(_train(run), "main_vsi.py"), "STOP cannot be removed", "remove it yourself")
    assert (run / "STOP" / "inside").is_dir()
    (run / "STOP" / "inside").rmdir()
    stop = StopOnSignal(run / "STOP")
    assert stop._local() == "the STOP file"  # `mkdir RUN/STOP` asks to stop as `touch RUN/STOP` does
    stop.consume(is_main=True)
    assert not (run / "STOP").exists()
    (run / "STOP").mkdir()
    remove_stop_file(run / "STOP")  # an empty one left by an earlier invocation is removed at start
    assert not (run / "STOP").exists()


def test_metrics_jsonl_that_is_a_directory_is_one_line_before_anything_loads(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "metrics.jsonl").mkdir(parents=True)
    _one_line(
        capsys,
        run_main(_train(run, **{"log.resume": "auto"}), "main_vsi.py"),
        "metrics.jsonl is not a file",
        "move it away",
    )


def test_an_output_dir_ending_in_dotdot_is_one_line(tmp_path, capsys):
    (tmp_path / "par").mkdir()
    _one_line(
        capsys, run_main(_train(f"{tmp_path}/par/child/.."), "main_vsi.py"), "ends in '..'", f"({tmp_path / 'par'})"
    )
    assert not (tmp_path / "par" / "child").exists()


def test_an_output_path_that_is_not_utf8_is_one_line(tmp_path, capsys):
    import eval_vsi

    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/out\xff")  # as Python passes such an argv entry
    rc = run_main(lambda: eval_vsi.main(["--preset", "debug", "--dummy", "--out", bad]), "eval_vsi.py")
    _one_line(capsys, rc, "is not UTF-8 text")
    _one_line(capsys, run_main(_train(bad), "main_vsi.py"), "log.output_dir", "is not UTF-8 text")
    assert os.listdir(tmp_path) == []


def test_a_label_directory_whose_name_is_not_utf8_is_one_line_in_preprocessing(tmp_path, capsys):
    """The dataset records each image's path relative to it: a label folder named in another
    encoding made writing train.jsonl a UnicodeEncodeError traceback."""
    import vlm_traj_preprocess
    from a2c_ppo_acktr.labels.labeling import label_trajectories

    overrides = {
        "env": {"image_size": 16, "num_sweep_frames": 2, "image_history": 1, "max_turns": 3, "num_scenes": 6},
        "label": {"out_dir": str(tmp_path / "lab"), "num_episodes": 2, "batch_size": 2, "seed": 100},
        "log": {"progress_bar": False},
    }
    label_trajectories(load_config(preset="debug", overrides=overrides))
    labels = os.fsdecode(os.fsencode(str(tmp_path)) + b"/lab\xe9")  # Latin-1 "labe", as a copy from another system
    os.rename(tmp_path / "lab", labels)
    with pytest.raises(ConfigError, match="label.out_dir .* is not UTF-8 text"):  # the labeller refuses to write there
        label_trajectories(
            load_config(preset="debug", overrides={**overrides, "label": {**overrides["label"], "out_dir": labels}})
        )
    args = ["--preset", "debug", "--label.out_dir", labels, "--label.dataset_dir", str(tmp_path / "data")]
    rc = run_main(lambda: vlm_traj_preprocess.main(args), "vlm_traj_preprocess.py")
    _one_line(capsys, rc, "holds text that is not UTF-8", "rename the folder")
    assert not (tmp_path / "data" / "train.jsonl").exists()


# ------------------------------------------------------------------------ settings and inputs
def test_debug_frames_under_numberlines_minimum_are_one_line_naming_the_flag(capsys):
    from a2c_ppo_acktr.envs.registry import make_env

    overlay = str(REPO / "configs" / "envs" / "numberline.yaml")
    cfg = load_config(preset="debug", config=overlay)
    _one_line(
        capsys,
        run_main(lambda: make_env(cfg.env), "main_vsi.py"),
        "NumberLine-v0: image_size=32",
        "--env.image_size 64",
    )
    env = make_env(
        load_config(preset="debug", config=overlay, overrides=["env.image_size=64"]).env
    )  # the fix it names works
    assert env.reset(seed=0)[0]["images"][0].shape == (64, 64, 3)


def test_a_wrong_data_root_is_one_line(tmp_path, capsys):
    import eval_vsi

    rows = tmp_path / "rows.json"
    row = {
        "id": 0,
        "dataset": "arkitscenes",
        "scene_name": "41069025",
        "question_type": "object_counting",
        "question": "How many chair(s) are in this room?",
        "options": None,
        "ground_truth": "2",
    }
    rows.write_text(json.dumps([row]))
    base = ["--dummy", "--vsibench", str(rows), "--out", str(tmp_path / "e")]
    assert _exit_code(lambda: eval_vsi.main([*base, "--data-root", str(tmp_path / "nope")])) == 2
    _one_line(capsys, 2, "--data-root", "is not a directory")
    (tmp_path / "scans").mkdir()
    rc = run_main(lambda: eval_vsi.main([*base, "--data-root", str(tmp_path)]), "eval_vsi.py")
    _one_line(capsys, rc, "no episode could be evaluated", f"did you mean --data-root {tmp_path / 'scans'}")
    video = [
        "--protocol",
        "video",
        "--vsibench",
        str(rows),
        "--out",
        str(tmp_path / "v"),
        "--dummy",
        "--video-root",
        str(tmp_path / "nope"),
    ]
    _one_line(capsys, run_main(lambda: eval_vsi.main(video), "eval_vsi.py"), "--video-root", "is not a directory")


SAVED_TURN = {
    "iteration": 1,
    "rank": 0,
    "step": 0,
    "env": 0,
    "env_id": "VSI-v0",
    "episode": "it1-r0-env0-ep0",
    "continued": False,
    "prompt": "p",
    "images": [],
    "reply": "r",
    "action": None,
    "reward": 0.0,
    "terminated": False,
    "truncated": False,
    "temperature": 1.0,
    "value": 0.0,
    "advantage": None,
    "return": None,
    "log_prob": -1.0,
}


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not gzip at all", "is not a readable saved rollout"),
        (gzip.compress(b"{not json\n"), "row 1 is not a JSON line"),
        (gzip.compress(b"[1, 2]\n"), "row 1 is a JSON list"),
        (gzip.compress(b'\xff\xfe{"a": 1}\n'), "row 1 is not a JSON line"),
        (
            gzip.compress(
                (json.dumps(SAVED_TURN) + "\n" + json.dumps({**SAVED_TURN, "reward": "high"}) + "\n").encode()
            ),
            "row 2 has no valid 'reward'",
        ),
        (
            gzip.compress((json.dumps({k: v for k, v in SAVED_TURN.items() if k != "episode"}) + "\n").encode()),
            "row 1 has no valid 'episode'",
        ),
        (gzip.compress(json.dumps(SAVED_TURN).encode() * 50)[:40], "is not a readable saved rollout"),  # truncated
    ],
    ids=["not-gzip", "not-json", "array", "not-utf8", "wrong-type", "missing-field", "truncated"],
)
def test_rollouts_show_on_malformed_contents_is_one_line(tmp_path, capsys, content, message):
    from a2c_ppo_acktr.rl import saved_rollouts as rollouts

    path = tmp_path / "iter-000001-rank0.jsonl.gz"
    path.write_bytes(content)
    rc = run_main(lambda: rollouts.main(["show", str(path)]), "python -m a2c_ppo_acktr.rl.saved_rollouts")
    _one_line(capsys, rc, message)


def test_rollouts_show_prints_a_well_formed_file(tmp_path, capsys):
    from a2c_ppo_acktr.rl import saved_rollouts as rollouts

    path = tmp_path / "iter-000001-rank0.jsonl.gz"
    path.write_bytes(gzip.compress((json.dumps(SAVED_TURN) + "\n").encode()))
    assert run_main(lambda: rollouts.main(["show", str(path)]), "python -m a2c_ppo_acktr.rl.saved_rollouts") == 0
    assert "=== episode it1-r0-env0-ep0" in capsys.readouterr().out


@pytest.mark.slow
def test_a_truncated_adapter_in_export_is_one_line(tmp_path, capsys, tiny_model_path):
    from a2c_ppo_acktr import export
    from a2c_ppo_acktr.config.arguments import ModelConfig
    from a2c_ppo_acktr.policy.model import VLMPolicy

    cfg = ModelConfig(
        model_path=tiny_model_path, device="cpu", lora_r=4, lora_alpha=8, value_head_hidden=8, temp_head_hidden=8
    )
    VLMPolicy(cfg).save_pretrained(tmp_path / "adapter")
    weights = tmp_path / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    argv = ["--adapter", str(tmp_path / "adapter"), "--model-path", tiny_model_path, "--out", str(tmp_path / "merged")]
    _one_line(
        capsys,
        run_main(lambda: export.main(argv), "export"),
        "the adapter at",
        "cannot be read",
        "truncated or damaged",
    )
    assert not (tmp_path / "merged").exists() and not list(tmp_path.glob(".tmp-export-*"))
    (tmp_path / "adapter" / "adapter_config.json").write_text('{"base_model_name_or_path": ')
    argv = ["--adapter", str(tmp_path / "adapter"), "--out", str(tmp_path / "merged")]
    _one_line(capsys, run_main(lambda: export.main(argv), "export"), "adapter_config.json is not an adapter config")


# ------------------------------------------------------------------------ checkpoints
def test_a_complete_marker_with_an_empty_files_map_is_damage(tmp_path, caplog):
    from a2c_ppo_acktr.run.checkpoint import COMPLETE_MARKER, CheckpointManager, resolve_resume, verify_checkpoint

    root = tmp_path / "checkpoints"
    manager = CheckpointManager(root, keep=3)
    for it in (1, 2):
        manager.save(it, lambda tmp, it=it: (tmp / "trainable.pt").write_bytes(bytes([it]) * 64))
    last = root / "checkpoint-000002"
    (last / COMPLETE_MARKER).write_text(json.dumps({"iteration": 2, "files": {}}))
    (last / "trainable.pt").write_bytes(b"")  # what the empty map would have let through
    assert "files' map is empty" in verify_checkpoint(last)
    with caplog.at_level("WARNING"):
        assert resolve_resume("auto", root) == root / "checkpoint-000001"


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory):
    """A finished 2-iteration debug run (its checkpoints are copied and damaged by the tests)."""
    from a2c_ppo_acktr.rl.train import run_training

    out = tmp_path_factory.mktemp("ppo") / "run"
    run_training(_ppo_cfg(out))
    return out


def _old_format_copy(run: Path, dest: Path) -> Path:
    """A copy of ``run`` whose last checkpoint has a marker from before checksums (verifies nothing)."""
    shutil.copytree(run, dest)
    last = dest / "checkpoints" / "checkpoint-000002"
    (last / "COMPLETE").write_text(json.dumps({"iteration": 2, "num_processes": 1}))
    return last


@pytest.mark.slow
@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate-trainable", "trainable.pt cannot be read"),
        ("list-state", "rank000.pkl is not this run's per-process state (it holds a list"),
        ("dict-state", "rank000.pkl is not this run's per-process state (it lacks ['env', 'observations'"),
        ("bad-rng", "rank000.pkl does not hold the state this run saves"),
    ],
    ids=["corrupt-state", "list-pickle", "dict-missing-keys", "wrong-shaped-rng"],
)
def test_an_old_format_checkpoint_with_a_damaged_state_is_one_line(tmp_path, capsys, ppo_run, damage, message):
    from a2c_ppo_acktr.run.checkpoint import load_pickle, save_pickle

    last = _old_format_copy(ppo_run, tmp_path / "run")
    if damage == "truncate-trainable":
        (last / "trainable.pt").write_bytes((last / "trainable.pt").read_bytes()[:50])
    elif damage == "list-state":
        save_pickle([1, 2, 3], last / "rank000.pkl")
    elif damage == "dict-state":
        save_pickle({"rng": None, "ppo": {}}, last / "rank000.pkl")
    else:
        state = load_pickle(last / "rank000.pkl")
        save_pickle({**state, "rng": [1, 2]}, last / "rank000.pkl")
    rc = run_main(_train(tmp_path / "run", **{"ppo.num_iterations": "3", "log.resume": str(last)}), "main_vsi.py")
    _one_line(capsys, rc, message, "resume from an earlier checkpoint")


# ------------------------------------------------------------------------ reports
def _report(tmp_path, name: str) -> Path:
    import eval_vsi

    assert (
        run_main(
            lambda: eval_vsi.main(
                ["--preset", "debug", "--dummy", "--eval.num_episodes", "2", "--out", str(tmp_path / name)]
            ),
            "eval_vsi.py",
        )
        == 0
    )
    return tmp_path / name / "report.json"


@pytest.mark.slow
def test_compare_with_duplicate_names_is_one_line_and_one_report_twice_gets_numbered_rows(tmp_path, capsys):
    import eval_vsi

    a, b = _report(tmp_path, "a"), _report(tmp_path, "b")
    capsys.readouterr()
    rc = run_main(
        lambda: eval_vsi.main(["compare", str(a), str(b), "--names", "x", "x", "--out", str(tmp_path / "c")]),
        "eval_vsi.py",
    )
    _one_line(capsys, rc, "--names repeats ['x']")
    rc = run_main(
        lambda: eval_vsi.main(["compare", str(a), str(b), "--names", "x", "--out", str(tmp_path / "c")]), "eval_vsi.py"
    )
    _one_line(capsys, rc, "got 1 names for 2 reports")
    assert (
        run_main(lambda: eval_vsi.main(["compare", str(a), str(a), "--out", str(tmp_path / "c")]), "eval_vsi.py") == 0
    )
    table = (tmp_path / "c" / "compare.md").read_text()
    assert "| dummy (a) #1 |" in table and "| dummy (a) #2 |" in table


def test_curves_of_nan_only_metrics_are_one_line(tmp_path, capsys):
    import eval_vsi

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(
        "".join(
            json.dumps({"iteration": i, "losses/policy": "nan", "rollout/episode_score_mean": "nan"}) + "\n"
            for i in (1, 2)
        )
    )
    rc = run_main(lambda: eval_vsi.main(["curves", str(metrics), "--out", str(tmp_path / "o")]), "eval_vsi.py")
    _one_line(capsys, rc, "holds no finite numeric metric to plot")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--categories"], "--categories names no category"),
        (["--categories", "unicorn"], "unknown categories ['unicorn']"),
        (["--size", "8"], "--size=8 must be in [16, 1024]"),
        (["--rooms", "0"], "--rooms=0 must be in [1, 64]"),
        (["--size", "big"], "argument --size: invalid int value"),
        (["--out-is-a-file"], "is a file, not a directory"),
    ],
)
def test_gallery_argument_errors_are_one_line(tmp_path, capsys, argv, message):
    from a2c_ppo_acktr.envs import gallery

    out = tmp_path / "g"
    if argv == ["--out-is-a-file"]:
        out.write_text("x")
        argv = ["--categories", "chair", "--rooms", "1", "--size", "16"]
    code = _exit_code(lambda: gallery.main(["--out", str(out), *argv]))
    _one_line(capsys, code, message)


# ------------------------------------------------------------------------ a full disk
def test_a_full_disk_while_logging_metrics_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno

    from a2c_ppo_acktr.run import logger as run_logger

    cfg = _ppo_cfg(tmp_path / "run")
    log = run_logger.RunLogger(cfg, tmp_path / "run")
    log.log({"a": 1.0}, iteration=1)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(run_logger, "open", full, raising=False)
    rc = run_main(lambda: log.log({"a": 2.0}, iteration=2), "main_vsi.py")
    _one_line(
        capsys, rc, "writing iteration 2's row to", "metrics.jsonl failed: No space left on device", "--resume auto"
    )
