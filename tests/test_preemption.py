"""Preemption: a real training process that receives SIGTERM mid-run finishes its iteration, writes a
checkpoint and exits 75; the resumed run equals an uninterrupted one. While it runs, a second process
on the same directory is refused with one line naming it. stop_after_iterations counts per invocation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from a2c_ppo_acktr.config.arguments import load_config
from a2c_ppo_acktr.run.checkpoint import latest_checkpoint
from a2c_ppo_acktr.run.logger import read_metrics
from a2c_ppo_acktr.run.preemption import PREEMPTED_EXIT_CODE
from helpers import run_overrides

REPO = Path(__file__).resolve().parent.parent
ITERATIONS = 30  # far more than run before the signal lands: the schedule spans them all


def _overrides(out: Path, **extra: str) -> list[str]:
    defaults = {
        "log.save_interval": "100",
        "ppo.num_iterations": str(ITERATIONS),
        "env.max_turns": "2",
        "model.max_new_tokens": "24",
    }
    return run_overrides(out, defaults, extra)


def _strip(rows):
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]


def _wait_for_rows(path: Path, n: int, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    t0 = time.monotonic()
    while not (path.is_file() and len(path.read_text().splitlines()) >= n):
        assert proc.poll() is None, f"training exited early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() - t0 < timeout, "no metrics row in time"
        time.sleep(0.2)


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path):
    from a2c_ppo_acktr.rl.train import run_training

    cut = tmp_path / "cut"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    argv = [sys.executable, "main_vsi.py", "--preset", "debug", *_overrides(cut)]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_rows(cut / "metrics.jsonl", 1, proc)
        second = subprocess.run(
            argv + ["--log.resume", "auto"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
        )
        assert second.returncode == 2 and f"pid {proc.pid}" in second.stderr and "Traceback" not in second.stderr, (
            second.stderr[-2000:]
        )
        proc.send_signal(signal.SIGTERM)  # mid-iteration: a row was just written and the next rollout runs
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == PREEMPTED_EXIT_CODE, err[-3000:]
    stopped = len(read_metrics(cut / "metrics.jsonl"))
    assert (
        1 <= stopped < ITERATIONS and f"stopped by SIGTERM after iteration {stopped}" in err and "Traceback" not in err
    )
    assert latest_checkpoint(cut / "checkpoints").name.endswith(f"{stopped:06d}")

    resumed = run_training(
        load_config(
            preset="debug", overrides=_overrides(cut, **{"log.resume": "auto", "log.stop_after_iterations": "1"})
        )
    )
    whole = run_training(
        load_config(
            preset="debug", overrides=_overrides(tmp_path / "whole", **{"log.stop_after_iterations": str(stopped + 1)})
        )
    )
    a, b = torch.load(resumed / "trainable.pt"), torch.load(whole / "trainable.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert _strip(read_metrics(cut / "metrics.jsonl")) == _strip(read_metrics(tmp_path / "whole" / "metrics.jsonl"))


def test_stop_after_iterations_counts_per_invocation(tmp_path):
    from a2c_ppo_acktr.rl.train import run_training

    over = _overrides(
        tmp_path / "r", **{"ppo.num_iterations": "3", "log.save_interval": "1", "log.stop_after_iterations": "1"}
    )
    for expected in (1, 2, 3):  # the same command, repeated as a time-limited job would
        last = run_training(load_config(preset="debug", overrides=over + ["log.resume=auto"]))
        assert last.name.endswith(f"{expected:06d}") and len(read_metrics(tmp_path / "r" / "metrics.jsonl")) == expected


def test_the_first_signal_asks_to_stop_and_the_second_stops_at_once():
    import pytest

    from a2c_ppo_acktr.run.preemption import StopOnSignal

    before = signal.getsignal(signal.SIGINT)
    with StopOnSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.signame == "SIGINT"
        with pytest.raises(KeyboardInterrupt, match=r"second signal \(SIGTERM\) after SIGINT"):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
