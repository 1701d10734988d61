"""Atomic checkpoints, resume resolution, RNG capture and the metrics log (no model needed)."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.arguments import RunConfig
from a2c_ppo_acktr.checkpoint import (
    COMPLETE_MARKER,
    CheckpointError,
    CheckpointManager,
    capture_rng_state,
    checkpoint_iteration,
    checkpoint_name,
    find_generators,
    latest_checkpoint,
    list_checkpoints,
    resolve_resume,
    restore_rng_state,
)
from a2c_ppo_acktr.logger import RunLogger, read_metrics


def _writer(payload: dict):
    def write(tmp):
        torch.save(payload, tmp / "state.pt")

    return write


def test_save_publishes_complete_checkpoint_and_prunes(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    for it in (1, 2, 3):
        path = mgr.save(it, _writer({"it": it}))
        assert path.name == checkpoint_name(it)
        assert (path / COMPLETE_MARKER).is_file()
        assert json.loads((path / COMPLETE_MARKER).read_text())["iteration"] == it
    kept = list_checkpoints(tmp_path)
    assert [checkpoint_iteration(p) for p in kept] == [2, 3]
    assert torch.load(kept[-1] / "state.pt")["it"] == 3
    # Nothing but the kept checkpoints is left behind (no temporary directories).
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(2), checkpoint_name(3)]


def test_interrupted_write_leaves_previous_checkpoint_loadable(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=1)
    mgr.save(1, _writer({"it": 1}))

    def crashing_writer(tmp):
        torch.save({"it": 2}, tmp / "state.pt")
        raise KeyboardInterrupt("simulated crash mid-write")

    with pytest.raises(KeyboardInterrupt):
        mgr.save(2, crashing_writer)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == checkpoint_name(1)
    assert torch.load(latest / "state.pt")["it"] == 1
    assert resolve_resume("auto", tmp_path) == latest
    # The next successful save cleans the debris and prunes the older checkpoint (keep=1).
    mgr.save(3, _writer({"it": 3}))
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(3)]


def test_directory_without_marker_is_ignored_and_refused(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(1, _writer({"it": 1}))
    mgr.save(2, _writer({"it": 2}))
    broken = tmp_path / checkpoint_name(5)  # e.g. copied by hand, or a marker lost
    broken.mkdir()
    torch.save({"it": 5}, broken / "state.pt")
    assert latest_checkpoint(tmp_path).name == checkpoint_name(2)
    with pytest.raises(CheckpointError, match=COMPLETE_MARKER):
        resolve_resume(str(broken), tmp_path)
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        resolve_resume(str(tmp_path / "nope"), tmp_path)


def test_resolve_resume_modes(tmp_path):
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("auto", tmp_path / "missing") is None  # nothing to resume: fresh start
    mgr = CheckpointManager(tmp_path, keep=5)
    for it in (2, 10, 4):  # iteration order, not creation order, decides "latest"
        mgr.save(it, _writer({"it": it}))
    assert resolve_resume("auto", tmp_path).name == checkpoint_name(10)
    explicit = tmp_path / checkpoint_name(4)
    assert resolve_resume(str(explicit), tmp_path) == explicit


def test_resaving_same_iteration_replaces_it(tmp_path):
    mgr = CheckpointManager(tmp_path, keep=2)
    mgr.save(3, _writer({"v": "a"}))
    mgr.save(3, _writer({"v": "b"}))
    assert [p.name for p in list_checkpoints(tmp_path)] == [checkpoint_name(3)]
    assert torch.load(tmp_path / checkpoint_name(3) / "state.pt")["v"] == "b"


def _draw(tg: torch.Generator, ng: np.random.Generator) -> list:
    return [random.random(), float(np.random.rand()), float(torch.rand(1)), float(torch.rand(1, generator=tg)), float(ng.random())]


def test_rng_capture_restore_replays_every_stream():
    class Owner:  # an object holding its own generators, like PPO's shuffler
        def __init__(self):
            self.shuffle = torch.Generator().manual_seed(3)
            self.np_rng = np.random.default_rng(4)
            self.not_a_generator = 5

    owner = Owner()
    gens = find_generators(owner, "owner")
    assert sorted(gens) == ["owner.np_rng", "owner.shuffle"]
    _draw(owner.shuffle, owner.np_rng)
    state = capture_rng_state(gens)
    first = [_draw(owner.shuffle, owner.np_rng) for _ in range(3)]
    restore_rng_state(state, gens)
    again = [_draw(owner.shuffle, owner.np_rng) for _ in range(3)]
    assert first == again
    # Restoring must matter: without it the streams go on to new numbers.
    assert _draw(owner.shuffle, owner.np_rng) != first[0]
    with pytest.raises(CheckpointError, match="no state for random generator"):
        restore_rng_state(state, {"other": torch.Generator()})


def test_logger_writes_rows_and_truncates_on_resume(tmp_path):
    cfg = RunConfig.from_dict({"log": {"output_dir": str(tmp_path), "tensorboard": False, "wandb_mode": "disabled"}})
    log = RunLogger(cfg, tmp_path)
    for it in (1, 2, 3):
        log.log({"losses/approx_kl": 0.1 * it, "charts/x": float("nan")}, iteration=it)
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in rows] == [1, 2, 3]
    assert rows[1]["losses/approx_kl"] == pytest.approx(0.2)
    assert rows[0]["charts/x"] == "nan"
    # Resuming from the checkpoint of iteration 2 drops the row of iteration 3 (it will be redone).
    RunLogger(cfg, tmp_path, start_iteration=2).close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    # A run killed while writing its row of iteration 3 leaves a torn line: resuming from
    # iteration 2 still works, and the rewritten file is well formed.
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"iteration": 3, "losses/appr')
    log = RunLogger(cfg, tmp_path, start_iteration=2)
    log.log({"losses/approx_kl": 0.3}, iteration=3)
    log.close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
    # Non-main processes write nothing.
    RunLogger(cfg, tmp_path / "other", is_main=False).log({"a": 1.0}, iteration=1)
    assert not (tmp_path / "other").exists()


def test_logger_tensorboard_events(tmp_path):
    cfg = RunConfig.from_dict({"log": {"output_dir": str(tmp_path), "tensorboard": True}})
    log = RunLogger(cfg, tmp_path)
    log.log({"losses/value_loss": 1.5}, iteration=1)
    log.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("losses/value_loss")
    assert [(e.step, e.value) for e in events] == [(1, 1.5)]
