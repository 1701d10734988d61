"""One output rule for every command that writes a directory or files: refuse, or move aside to
``NAME.old-<time>`` (never replace), and respect a live process's lock, even when someone deletes the
lock file under a running run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from a2c_ppo_acktr.config.arguments import ConfigError, load_config
from a2c_ppo_acktr.config.cli import run_main
from a2c_ppo_acktr.run.rundir import (
    RunLock,
    RunLockedError,
    RunLockLostError,
    claim_output_dir,
    claim_output_files,
    lock_path,
    move_aside,
)

from helpers import one_line_error as _one_line

REPO = Path(__file__).resolve().parent.parent
HOLD = (
    "import sys, time; from a2c_ppo_acktr.run.rundir import RunLock; RunLock(sys.argv[1]).acquire(); print('locked', "
    "flush=True); time.sleep(600)"
)
PROBE = (
    "import sys; from a2c_ppo_acktr.run.rundir import RunLock, RunLockedError\ntry:\n    "
    "RunLock(sys.argv[1]).acquire()\nexcept RunLockedError:\n    print('refused')\n"
)
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _holder(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True, env=ENV
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    proc.stdout.close()


# ------------------------------------------------------------------------ the lock survives deletion
def test_a_deleted_lock_file_is_taken_back_and_one_another_process_holds_stops_this_one(tmp_path, caplog):
    run = tmp_path / "run"
    lock = RunLock(run).acquire()
    try:
        lock_path(run).unlink()  # nobody else took it: confirm locks the name again
        with caplog.at_level("WARNING", logger="a2c_ppo_acktr.run.rundir"):
            lock.confirm()
        assert "it is locked again" in caplog.text and json.loads(lock_path(run).read_text())["pid"] == os.getpid()
        probe = subprocess.run(
            [sys.executable, "-c", PROBE, str(run)], cwd=REPO, capture_output=True, text=True, env=ENV
        )
        assert probe.stdout.strip() == "refused"  # the new file is held: a second process is kept out
        lock_path(run).unlink()
        other = _holder(run)  # a second process locks the new file the name points to
        try:
            with pytest.raises(RunLockLostError, match=f"was removed while this process held .*pid {other.pid}"):
                lock.confirm()
            assert not lock.held
            with pytest.raises(RunLockedError, match=f"pid {other.pid}"):
                claim_output_dir(run, overwrite=True)  # nothing of the other's is moved
        finally:
            _stop(other)
    finally:
        lock.release()


def _ppo_cfg(out: Path, **extra: str):
    base = {
        "log.output_dir": str(out),
        "log.progress_bar": "false",
        "log.tensorboard": "false",
        "log.save_interval": "1",
        "ppo.num_iterations": "3",
        "env.max_turns": "2",
        "model.max_new_tokens": "24",
    }
    base.update(extra)
    return load_config(preset="debug", overrides=[f"{k}={v}" for k, v in base.items()])


@pytest.mark.slow
def test_ppo_takes_back_a_deleted_lock_and_stops_in_one_line_when_another_run_took_it(tmp_path, monkeypatch, capsys):
    """Iteration 1: the lock file is deleted, nobody takes it: the run locks it again and goes on.
    Iteration 2: deleted again and a second process takes it: the run stops with one line before it
    writes the row or the checkpoint of iteration 2, and removes nothing of the other's."""
    from a2c_ppo_acktr.rl import train
    from a2c_ppo_acktr.run.checkpoint import list_checkpoints
    from a2c_ppo_acktr.run.logger import read_metrics

    out = tmp_path / "run"
    real_validate = train.validate
    other: list[subprocess.Popen] = []

    def validate(run, iteration, log=None):
        lock_path(out).unlink()
        if iteration == 2:
            other.append(_holder(out))
            (out / "checkpoints" / ".tmp-checkpoint-000002").mkdir()  # the other run's write in progress
        return real_validate(run, iteration, log)

    monkeypatch.setattr(train, "validate", validate)
    try:
        rc = run_main(lambda: train.run_training(_ppo_cfg(out)), "main_vsi.py")
        _one_line(capsys, rc, f"pid {other[0].pid}", "was removed while this process held", "stops here")
    finally:
        for proc in other:
            _stop(proc)
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["checkpoint-000001"]
    assert [r["iteration"] for r in read_metrics(out / "metrics.jsonl")] == [1]
    assert (out / "checkpoints" / ".tmp-checkpoint-000002").is_dir()  # not this run's to clean


def test_a_checkpoint_is_not_published_once_another_process_holds_the_directory(tmp_path):
    from a2c_ppo_acktr.run.checkpoint import CheckpointManager, list_checkpoints
    from a2c_ppo_acktr.run.rundir import confirm_lock

    run = tmp_path / "run"
    other = []

    def writer(tmp: Path) -> None:
        (tmp / "a.bin").write_bytes(b"1")
        lock_path(run).unlink()
        other.append(_holder(run))

    with RunLock(run):
        manager = CheckpointManager(run / "checkpoints", keep=2, guard=lambda: confirm_lock(run))
        manager.save(1, lambda tmp: (tmp / "a.bin").write_bytes(b"0"))
        try:
            with pytest.raises(RunLockLostError):
                manager.save(2, writer)
        finally:
            _stop(other[0])
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["checkpoint-000001"]


# ------------------------------------------------------------------------ export
def test_export_overwrite_refuses_a_directory_where_a_run_is_training(tmp_path, capsys):
    from a2c_ppo_acktr import export

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    holder = _holder(run)
    try:
        argv = ["--adapter", str(adapter), "--model-path", "tiny:qwen2_5_vl", "--out", str(run), "--overwrite"]
        rc = run_main(lambda: export.main(argv), "python -m a2c_ppo_acktr.export")
        _one_line(capsys, rc, f"in use by another run: pid {holder.pid}")
    finally:
        _stop(holder)
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "metrics.jsonl"]  # not moved aside
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]
    with RunLock(tmp_path / "busy"):  # the guard itself refuses, whatever the command
        claim = (
            "import sys; from a2c_ppo_acktr.run.rundir import claim_output_dir; claim_output_dir(sys.argv[1], "
            "overwrite=True)"
        )
        done = subprocess.run(
            [sys.executable, "-c", claim, str(tmp_path / "busy")], cwd=REPO, env=ENV, capture_output=True, text=True
        )
    assert done.returncode != 0 and "RunLockedError" in done.stderr


# ------------------------------------------------------------------------ SFT dataset
def test_preprocessing_refuses_an_existing_dataset_and_overwrite_moves_its_files_aside(tmp_path, capsys):
    import vlm_traj_preprocess
    from a2c_ppo_acktr.labels.labeling import label_trajectories

    overrides = {
        "env": {"image_size": 16, "num_sweep_frames": 2, "image_history": 1, "max_turns": 3, "num_scenes": 6},
        "label": {"out_dir": str(tmp_path / "lab"), "num_episodes": 3, "batch_size": 3, "seed": 100},
        "log": {"progress_bar": False},
    }
    label_trajectories(load_config(preset="debug", overrides=overrides))
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine")
    args = ["--preset", "debug", "--label.out_dir", str(tmp_path / "lab"), "--label.dataset_dir", str(data)]
    vlm_traj_preprocess.main(args)
    first = (data / "train.jsonl").read_bytes()
    rc = run_main(lambda: vlm_traj_preprocess.main(args + ["--label.min_score", "0.5"]), "vlm_traj_preprocess.py")
    _one_line(capsys, rc, "already holds train.jsonl, val.jsonl, stats.json", "--overwrite")
    assert (data / "train.jsonl").read_bytes() == first
    vlm_traj_preprocess.main(args + ["--overwrite"])
    (aside,) = data.glob("train.jsonl.old-*")
    assert (
        aside.read_bytes() == first and (data / "train.jsonl").is_file() and (data / "notes.txt").read_text() == "mine"
    )
    assert len(list(data.glob("stats.json.old-*"))) == 1


# ------------------------------------------------------------------------ eval_vsi.py
def _eval(out: Path, *extra: str) -> list[str]:
    return ["--preset", "debug", "--dummy", "--eval.num_episodes", "2", "--out", str(out), *extra]


def test_a_second_evaluation_on_one_out_stops_in_one_line_and_the_first_holds_the_lock_throughout(
    tmp_path, monkeypatch, capsys
):
    import eval_vsi
    from a2c_ppo_acktr.eval import evaluation

    out = tmp_path / "e"
    holder = _holder(out)  # another evaluation writing into --out
    try:
        rc = run_main(lambda: eval_vsi.main(_eval(out)), "eval_vsi.py")
        _one_line(capsys, rc, f"in use by another run: pid {holder.pid}")
    finally:
        _stop(holder)
    assert not (out / "report.json").exists()
    real = evaluation.evaluate
    probes = []

    def evaluate(*args, **kwargs):  # another process tries the directory mid-evaluation, then after the report
        probes.append(
            subprocess.run(
                [sys.executable, "-c", PROBE, str(out)], cwd=REPO, capture_output=True, text=True, env=ENV
            ).stdout.strip()
        )
        report = real(*args, **kwargs)
        probes.append(
            subprocess.run(
                [sys.executable, "-c", PROBE, str(out)], cwd=REPO, capture_output=True, text=True, env=ENV
            ).stdout.strip()
        )
        return report

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    assert run_main(lambda: eval_vsi.main(_eval(out)), "eval_vsi.py") == 0
    assert probes == ["refused", "refused"] and (out / "report.json").is_file()


def test_compare_and_curves_claim_only_their_own_files_beside_a_report(tmp_path, capsys):
    import eval_vsi

    for name in ("a", "b"):
        assert run_main(lambda name=name: eval_vsi.main(_eval(tmp_path / name)), "eval_vsi.py") == 0
    capsys.readouterr()
    mine = tmp_path / "a" / "compare.md"
    mine.write_text("my notes")
    cmp = [
        "compare",
        str(tmp_path / "a" / "report.json"),
        str(tmp_path / "b" / "report.json"),
        "--out",
        str(tmp_path / "a"),
    ]
    rc = run_main(lambda: eval_vsi.main(cmp), "eval_vsi.py")
    _one_line(capsys, rc, "already holds compare.md", "--overwrite")
    assert mine.read_text() == "my notes"
    assert run_main(lambda: eval_vsi.main(cmp + ["--overwrite"]), "eval_vsi.py") == 0
    (aside,) = (tmp_path / "a").glob("compare.md.old-*")
    assert aside.read_text() == "my notes" and (tmp_path / "a" / "report.json").is_file()  # the report stays


# ------------------------------------------------------------------------ gallery, mini benchmark
def test_gallery_refuses_its_sheets_where_they_are_and_keeps_the_users_files(tmp_path, capsys):
    from a2c_ppo_acktr.envs import gallery

    out = tmp_path / "pics"
    out.mkdir()
    (out / "rooms.png").write_bytes(b"mine")
    (out / "other.png").write_bytes(b"also mine")
    argv = ["--out", str(out), "--size", "16", "--rooms", "1", "--categories", "chair"]
    rc = run_main(lambda: gallery.main(argv), "python -m a2c_ppo_acktr.envs.gallery")
    _one_line(capsys, rc, "already holds rooms.png", "--overwrite")
    assert (out / "rooms.png").read_bytes() == b"mine" and not (out / "categories.png").exists()
    assert run_main(lambda: gallery.main(argv + ["--overwrite"]), "python -m a2c_ppo_acktr.envs.gallery") == 0
    (aside,) = out.glob("rooms.png.old-*")
    assert aside.read_bytes() == b"mine" and (out / "other.png").read_bytes() == b"also mine"
    assert (out / "rooms.png").read_bytes()[:4] == b"\x89PNG"


def test_mini_benchmark_refuses_a_used_folder_and_a_failed_build_leaves_nothing(tmp_path, capsys):
    from helpers import mini_vsibench_module

    mini = mini_vsibench_module()
    out = tmp_path / "mini"
    out.mkdir()
    (out / "test.parquet").write_bytes(b"the user's rows")
    small = ["--out", str(out), "--scenes", "1", "--frames", "4", "--size", "16"]
    rc = run_main(lambda: mini.main(small), "make_mini_vsibench.py")
    _one_line(capsys, rc, "already holds output", "--overwrite")
    assert (out / "test.parquet").read_bytes() == b"the user's rows"
    # This room shows too few objects in 8 frames for every question type: the build fails, and the
    # old folder (moved aside only once the new one is whole) stays, with no half-built one beside it.
    failing = ["--out", str(out), "--scenes", "1", "--frames", "8", "--size", "64", "--overwrite"]
    rc = run_main(lambda: mini.main(failing), "make_mini_vsibench.py")
    _one_line(capsys, rc, "support no question of types")
    assert (out / "test.parquet").read_bytes() == b"the user's rows"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".mini.lock", "mini"]
    assert run_main(lambda: mini.main(small + ["--overwrite"]), "make_mini_vsibench.py") == 0
    (aside,) = tmp_path.glob("mini.old-*")
    assert (aside / "test.parquet").read_bytes() == b"the user's rows" and (out / "manifest.json").is_file()


# ------------------------------------------------------------------------ the guard's names
def test_an_existing_old_name_or_a_dangling_link_there_is_never_replaced(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("new\n")
    taken = tmp_path / "run.old-20250101-000000"
    taken.mkdir()
    (taken / "metrics.jsonl").write_text("older\n")
    (tmp_path / "run.old-20250101-000000-1").symlink_to(tmp_path / "gone")  # a dangling link
    aside = move_aside(run)
    assert aside.name == "run.old-20250101-000000-2" and (aside / "metrics.jsonl").read_text() == "new\n"
    assert (taken / "metrics.jsonl").read_text() == "older\n"


def test_log_overwrite_with_an_existing_old_name_moves_the_run_to_a_free_one(tmp_path, monkeypatch):
    """prepare_output_dir used its own NAME.old-<time>: an empty directory of that name was replaced,
    a non-empty one was an OSError traceback."""
    import time

    from a2c_ppo_acktr.rl.run_state import prepare_output_dir

    monkeypatch.setattr(time, "strftime", lambda fmt, *a: "20250101-000000")
    out = tmp_path / "run"
    (out / "checkpoints" / "checkpoint-000001").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    (tmp_path / "run.old-20250101-000000").mkdir()
    (tmp_path / "run.old-20250101-000000" / "keep").write_text("x")
    acc = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    with RunLock(out):
        prepare_output_dir(_ppo_cfg(out, **{"log.overwrite": "true"}), None, acc)
    assert (tmp_path / "run.old-20250101-000000" / "keep").read_text() == "x"
    assert (tmp_path / "run.old-20250101-000000-1" / "metrics.jsonl").is_file()


def test_claim_output_files_refuses_named_files_and_moves_only_those(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.png").write_text("old")
    (folder / "b.txt").write_text("keep")
    with pytest.raises(ConfigError, match="already holds a.png"):
        claim_output_files(folder, ["a.png", "c.png"], overwrite=False)
    claim_output_files(folder, ["a.png", "c.png"], overwrite=True)
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith("a.png.old-")) == ["b.txt"]


def test_a_second_labeller_on_one_folder_is_refused(tmp_path):
    from a2c_ppo_acktr.labels.labeling import label_trajectories

    labels = tmp_path / "lab"
    holder = _holder(labels)  # a labeller appending to trajectories.jsonl
    try:
        cfg = load_config(
            preset="debug",
            overrides={"label": {"out_dir": str(labels), "num_episodes": 1}, "log": {"progress_bar": False}},
        )
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            label_trajectories(cfg)
    finally:
        _stop(holder)
    assert not (labels / "trajectories.jsonl").exists()


def test_a_tiny_build_into_a_used_folder_is_refused(tmp_path, capsys):
    from a2c_ppo_acktr.tiny import cli as tiny_cli

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rc = run_main(lambda: tiny_cli.main(["--out", str(model)]), "python -m a2c_ppo_acktr.tiny")
    _one_line(capsys, rc, "already holds output", "--overwrite")
    assert (model / "config.json").read_text() == "{}"
