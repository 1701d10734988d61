"""SFT stops as PPO does: SIGTERM or a STOP file end the run after its step with a checkpoint and exit
75, and ``--sft.resume auto`` goes on from there. Checkpoints are published whole: a write that is
interrupted leaves no ``checkpoint-N/``, and one that an older version left half-written is skipped
by ``--sft.resume auto`` instead of failing every resumption. A run whose lock another process took
stops at its next checkpoint without writing it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from a2c_ppo_acktr.config.cli import run_main
from a2c_ppo_acktr.run.preemption import PREEMPTED_EXIT_CODE

REPO = Path(__file__).resolve().parent.parent
HOLD = (
    "import sys, time; from a2c_ppo_acktr.run.rundir import RunLock; RunLock(sys.argv[1]).acquire(); print('locked', "
    "flush=True); time.sleep(600)"
)


def _data(tmp_path: Path) -> Path:
    from a2c_ppo_acktr.common.prompts import Answer, format_response
    from helpers import sft_observation, write_sft_rows

    rng = np.random.default_rng(6)
    rows = [(sft_observation(rng, 1 + i % 2), format_response("Three chairs.", Answer("3"))) for i in range(4)]
    (tmp_path / "data").mkdir()
    write_sft_rows(tmp_path / "data", rows)
    return tmp_path / "data" / "train.jsonl"


def _argv(data: Path, out: Path, tiny_model_path: str, **sft: str) -> list[str]:
    values = {
        "data_path": str(data),
        "output_dir": str(out),
        "max_steps": "3",
        "per_device_batch_size": "2",
        "save_steps": "100",
        "logging_steps": "1",
        **sft,
    }
    return [
        "--preset",
        "debug",
        "--model.model_path",
        tiny_model_path,
        "--model.device",
        "cpu",
        "--log.progress_bar",
        "false",
        *[a for k, v in values.items() for a in (f"--sft.{k}", v)],
    ]


def _at_step(monkeypatch, step: int, action) -> None:
    """Run ``action()`` at the end of optimizer step ``step``, before the run looks for a stop request."""
    from SFT import trainer

    real = trainer._StopCallback.on_step_end

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == step:
            action()
        return real(self, args, state, control, **kwargs)

    monkeypatch.setattr(trainer._StopCallback, "on_step_end", on_step_end)


def _steps(out: Path) -> list[str]:
    return sorted(p.name for p in out.glob("checkpoint-*"))


@pytest.mark.slow
def test_sigterm_and_stop_file_checkpoint_and_exit_75_and_resume_auto_skips_an_incomplete_checkpoint(
    tmp_path, tiny_model_path, monkeypatch, capsys, caplog
):
    import train_sft
    from SFT.trainer import ADAPTER_DIR, TRAIN_LOG

    data, out = _data(tmp_path), tmp_path / "sft"
    argv = _argv(data, out, tiny_model_path, resume="auto")

    # SIGTERM during step 1: the step finishes, checkpoint-1 is written, exit 75.
    _at_step(monkeypatch, 1, lambda: os.kill(os.getpid(), signal.SIGTERM))
    assert run_main(lambda: train_sft.main(argv), "train_sft.py") == PREEMPTED_EXIT_CODE
    err = capsys.readouterr().err
    assert (
        f"stopped by SIGTERM after step 1; checkpoint {out / 'checkpoint-1'} written; continue with --sft.resume auto"
        in err
    )
    assert _steps(out) == ["checkpoint-1"] and not (out / ADAPTER_DIR).exists()

    # The STOP file during step 2 asks the same; this time the checkpoint's write is cut short (a
    # second signal, a crash): nothing named checkpoint-2 appears.
    from transformers import Trainer

    monkeypatch.undo()
    _at_step(monkeypatch, 2, lambda: (out / "STOP").touch())

    def interrupted(self, output_dir):
        raise KeyboardInterrupt("a second signal during the checkpoint's write")

    monkeypatch.setattr(Trainer, "_save_rng_state", interrupted)
    assert run_main(lambda: train_sft.main(argv), "train_sft.py") == 130
    assert _steps(out) == ["checkpoint-1"]

    # What an interrupted write of the Trainer's own (non-atomic) save leaves: an empty checkpoint
    # directory. --sft.resume auto falls back past it to checkpoint-1 and finishes the run.
    monkeypatch.undo()
    (out / "checkpoint-5").mkdir()
    with caplog.at_level("WARNING", logger="SFT.trainer"):
        assert run_main(lambda: train_sft.main(argv), "train_sft.py") == 0
    assert f"skipping {out / 'checkpoint-5'}: it holds no trainer_state.json" in caplog.text
    assert not (out / "STOP").exists()  # the request left by the interrupted run was removed at start
    log = [e["step"] for e in json.loads((out / TRAIN_LOG).read_text()) if "loss" in e]
    assert log == [1, 2, 3]  # resumed after step 1: steps 2 and 3 ran once each in this run's log
    assert (out / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert not list(out.glob(".tmp-*"))


@pytest.mark.slow
def test_sft_stops_without_writing_when_another_process_took_its_lock(tmp_path, tiny_model_path, monkeypatch, capsys):
    import train_sft
    from a2c_ppo_acktr.run.rundir import lock_path

    data, out = _data(tmp_path), tmp_path / "sft"
    holders: list[subprocess.Popen] = []

    def take_over():
        lock_path(out).unlink()
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        holders.append(
            subprocess.Popen(
                [sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True, env=env
            )
        )
        assert holders[0].stdout.readline().strip() == "locked"

    _at_step(monkeypatch, 1, take_over)
    try:
        rc = run_main(lambda: train_sft.main(_argv(data, out, tiny_model_path, save_steps="1")), "train_sft.py")
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and f"pid {holders[0].pid}" in err and "stops here" in err, err
    finally:
        for proc in holders:
            proc.kill()
            proc.wait(30)
            proc.stdout.close()
    assert _steps(out) == [] and not list(out.glob(".tmp-*"))
