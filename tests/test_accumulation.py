"""Gradient accumulation and skipped windows on every backend: plain, accelerate-DDP and DeepSpeed
ZeRO-2/ZeRO-3 on 2 CPU ranks (gloo), each with ``ppo.grad_accum_steps`` 1, 2 and 4.

Every backend runs the same PPO updates on the same pickled rollout (``tests/accum_driver.py``) and
must take exactly ``epochs x minibatches / accumulation`` optimizer steps per update, less the
windows whose every loss was non-finite; such a window must leave the weights and the optimizer state
(Adam moments, step counts, ZeRO's fp32 master copy) bit for bit as they were; and the weights after
2 updates must equal the plain run's within fp32 tolerance (the data is the same on both ranks, so
the averaged gradient is the single-process one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import free_port

REPO = Path(__file__).resolve().parent.parent
DRIVER_PATH = REPO / "tests" / "accum_driver.py"
pytestmark = pytest.mark.slow


def _driver():
    spec = importlib.util.spec_from_file_location("accum_driver", DRIVER_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


D = _driver()
MINIBATCHES_PER_EPOCH = D.NUM_ENVS * D.NUM_STEPS // D.MINI_BATCH


def _expected_steps(gas: int, nan_calls: tuple[int, ...]) -> list[int]:
    """Cumulative optimizer steps after each update: one per window with at least one finite loss."""
    per_update = D.EPOCHS * MINIBATCHES_PER_EPOCH
    steps, total = [], 0
    for update in range(D.UPDATES):
        calls = range(update * per_update, (update + 1) * per_update)
        windows = [calls[i : i + gas] for i in range(0, per_update, gas)]
        total += sum(any(c not in nan_calls for c in w) for w in windows)
        steps.append(total)
    return steps


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> Path:
    """The rollout every backend trains on, and the plain single-process run on it."""
    root = tmp_path_factory.mktemp("accum")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        D.collect(root / "storage.pkl")
        D.main("plain", str(root / "storage.pkl"), str(root / "plain"))
    finally:
        torch.set_num_threads(threads)
    return root


def _run_two_ranks(backend: str, root: Path, *extra: str) -> Path:
    out = root / backend
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": str(REPO),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(DRIVER_PATH),
        backend,
        str(root / "storage.pkl"),
        str(out),
        *extra,
    ]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{backend} failed ({res.returncode}):\n{res.stdout[-2000:]}\n{res.stderr[-5000:]}"
    return out


def _check(out: Path, plain_dir: Path, ranks: int) -> None:
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    for name, (gas, nan_calls) in D.SCENARIOS.items():
        want = _expected_steps(gas, nan_calls)
        for rank, rec in enumerate(records):
            r = rec[name]
            assert r["steps"] == want, f"{name} rank {rank}: optimizer steps {r['steps']}, expected {want}"
            # The optimizer-state digest must see a real step (else the "untouched" checks below prove nothing).
            for u in range(D.UPDATES):
                stepped = want[u] > (want[u - 1] if u else 0)
                assert (r["optimizer"][u + 1] != r["optimizer"][u]) == stepped, (
                    f"{name} rank {rank} update {u}: optimizer state"
                )
                assert (r["weights"][u + 1] != r["weights"][u]) == stepped, f"{name} rank {rank} update {u}: weights"
            assert r["weights"] == records[0][name]["weights"], f"{name}: ranks hold different weights"
        mine, ref = torch.load(out / f"{name}.pt"), torch.load(plain_dir / f"{name}.pt")
        assert mine.keys() == ref.keys()
        dev = max(float((mine[k] - ref[k]).abs().max()) for k in ref)
        assert dev < 2e-5, f"{name}: weights differ from the plain run by {dev:.2e}"


def test_plain_steps_once_per_window_and_skipped_windows_touch_nothing(plain):
    _check(plain / "plain", plain / "plain", ranks=1)
    # Accumulation matters: 2 steps on 4-minibatch windows are not 8 steps on single minibatches.
    g1, g4 = torch.load(plain / "plain" / "gas1.pt"), torch.load(plain / "plain" / "gas4.pt")
    assert max(float((g1[k] - g4[k]).abs().max()) for k in g1) > 1e-3


@pytest.mark.multiprocess
def test_accelerate_ddp_two_processes(plain):
    _check(_run_two_ranks("ddp", plain), plain / "plain", ranks=2)


@pytest.mark.multiprocess
def test_deepspeed_zero2_two_ranks(plain):
    _check(_run_two_ranks("zero2", plain), plain / "plain", ranks=2)


@pytest.mark.multiprocess
def test_deepspeed_zero3_two_ranks(plain, tmp_path):
    # Partition even the tiny model's small LoRA matrices (the shipped threshold keeps them whole).
    ds = json.loads((REPO / "scripts" / "ds_config_zero3.json").read_text())
    ds["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = tmp_path / "zero3.json"
    path.write_text(json.dumps(ds))
    _check(_run_two_ranks("zero3", plain, str(path)), plain / "plain", ranks=2)
