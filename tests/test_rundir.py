"""Output directories: the guard (refuse, or move aside; never delete) and the run lock, with real
processes holding it; eval reports never land in a training run's directory or over an earlier report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from a2c_ppo_acktr.config.arguments import ConfigError
from a2c_ppo_acktr.run.rundir import (
    RunLock,
    RunLockedError,
    check_output_path,
    claim_output_dir,
    claim_report_dir,
    lock_path,
)

REPO = Path(__file__).resolve().parent.parent
HOLD = (
    "import sys, time; from a2c_ppo_acktr.run.rundir import RunLock; RunLock(sys.argv[1]).acquire(); print('locked', "
    "flush=True); time.sleep(600)"
)


def _holder(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_second_process_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, caplog):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(RunLockedError, match=f"in use by another run: pid {holder.pid} on "):
            RunLock(run).acquire()
    finally:
        holder.send_signal(signal.SIGKILL)  # dies without releasing: the kernel drops its lock
        holder.wait(30)
        holder.stdout.close()
    assert json.loads(lock_path(run).read_text())["pid"] == holder.pid  # its record is still there
    with caplog.at_level("INFO", logger="a2c_ppo_acktr.run.rundir"), RunLock(run) as lock:
        assert lock.held and json.loads(lock_path(run).read_text())["pid"] == os.getpid()
    assert f"pid {holder.pid}" in caplog.text and "is gone" in caplog.text
    assert lock_path(run).read_text() == ""  # released: the record is cleared
    RunLock(run).acquire().release()  # and free


def test_the_lock_stays_with_the_path_when_the_directory_is_moved_aside(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("{}\n")
    with RunLock(run):
        moved = claim_output_dir(run, overwrite=True)
        assert moved == run.resolve() and run.is_dir() and not any(run.iterdir())
        with pytest.raises(RunLockedError):
            RunLock(run).acquire()  # the new, empty directory is still this run's
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.old-")]
    assert len(aside) == 1 and (aside[0] / "metrics.jsonl").read_text() == "{}\n"


def test_output_paths_that_overlap_inputs_or_the_current_directory_are_refused(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    for out in (data, data / "sub", tmp_path):
        with pytest.raises(ConfigError, match="overlaps the input"):
            check_output_path(out, [data])
    monkeypatch.chdir(data / "sub")
    for out in (".", "..", str(data)):
        with pytest.raises(ConfigError, match="current directory"):
            check_output_path(out)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        check_output_path(tmp_path / "file")
    assert check_output_path(tmp_path / "new", [data]) == (tmp_path / "new").resolve()


def test_a_used_directory_is_refused_or_moved_aside_never_deleted(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "a.txt").write_text("first")
    with pytest.raises(ConfigError, match="already holds output.*--overwrite"):
        claim_output_dir(out, overwrite=False)
    assert (out / "a.txt").read_text() == "first"
    claim_output_dir(out, overwrite=True)
    claim_output_dir(out, overwrite=True)  # an empty directory is not "used": nothing to move
    (out / "b.txt").write_text("second")
    claim_output_dir(out, overwrite=True)
    kept = sorted(p for p in tmp_path.iterdir() if p.name.startswith("out.old-"))
    assert sorted((next(p.iterdir())).read_text() for p in kept) == ["first", "second"]


def test_reports_never_go_into_a_run_and_an_earlier_report_is_moved_aside_whole(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConfigError, match="training run's directory.*checkpoints"):
        claim_report_dir(run, overwrite=True)
    sft = tmp_path / "sft"
    (sft / "checkpoint-000010").mkdir(parents=True)
    with pytest.raises(ConfigError, match="checkpoint-000010"):
        claim_report_dir(sft, overwrite=False, files=["compare.md"])
    report = tmp_path / "eval"
    (report / "trajectories").mkdir(parents=True)
    (report / "trajectories" / "old.png").write_bytes(b"png")
    (report / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds output"):
        claim_report_dir(report, overwrite=False)
    assert claim_report_dir(report, overwrite=False, files=["compare.md"]) == report.resolve()  # --compare beside it
    claim_report_dir(report, overwrite=True)
    assert not (report / "trajectories").exists()  # no stale picture beside the next report
    aside = next(p for p in tmp_path.iterdir() if p.name.startswith("eval.old-"))
    assert (aside / "trajectories" / "old.png").read_bytes() == b"png"


def test_eval_refuses_an_earlier_report_in_one_line_and_overwrite_keeps_it(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "eval_vsi.py",
        "--preset",
        "debug",
        "--dummy",
        "--eval.num_episodes",
        "2",
        "--out",
        str(tmp_path / "e"),
    ]
    assert subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300).returncode == 0
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already holds output" in again.stderr and "Traceback" not in again.stderr
    assert (
        subprocess.run([*cmd, "--overwrite"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300).returncode
        == 0
    )
    assert (tmp_path / "e" / "report.json").is_file()
    assert [p.name.startswith("e.old-") for p in tmp_path.iterdir()].count(True) == 1
