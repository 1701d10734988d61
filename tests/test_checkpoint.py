"""Atomic checkpoints, resume resolution, RNG capture and the metrics log (no model needed)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from a2c_ppo_acktr.config.arguments import RunConfig
from a2c_ppo_acktr.run.checkpoint import (
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
from a2c_ppo_acktr.run.logger import RunLogger, read_metrics


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
    return [
        random.random(),
        float(np.random.rand()),
        float(torch.rand(1)),
        float(torch.rand(1, generator=tg)),
        float(ng.random()),
    ]


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
    # Resuming from the checkpoint of iteration 2 moves the row of iteration 3 (it will be redone)
    # to a numbered file; two fresh starts in place keep both earlier files (none is overwritten).
    RunLogger(cfg, tmp_path, start_iteration=2).close()
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl.old-1")] == [3]
    RunLogger(cfg, tmp_path).close()
    assert not (tmp_path / "metrics.jsonl").exists()
    assert [r["iteration"] for r in read_metrics(tmp_path / "metrics.jsonl.old-2")] == [1, 2]
    (tmp_path / "metrics.jsonl.old-2").rename(tmp_path / "metrics.jsonl")  # back, for the cases below
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


# ------------------------------------------------------------------------------------------------
# Edges the mutation run (scripts/mutation.sh checkpoint) found unpinned.
# ------------------------------------------------------------------------------------------------
def test_error_messages_name_the_offending_value(tmp_path):
    """Errors say what was wrong and what was expected, so a bad ``--resume`` or config is fixable."""
    assert checkpoint_iteration(tmp_path / "checkpoint-000042") == 42
    with pytest.raises(CheckpointError) as err:
        checkpoint_iteration("runs/ckpt-7")
    assert str(err.value) == "'runs/ckpt-7' is not a checkpoint directory (expected a name like 'checkpoint-000012')"
    with pytest.raises(CheckpointError) as err:
        CheckpointManager(tmp_path, keep=0)
    assert str(err.value) == "keep=0: at least one checkpoint must be kept (log.keep_checkpoints >= 1)"


def test_checkpoints_past_a_million_iterations_sort_by_number(tmp_path):
    """Names are zero-padded to six digits only: ``checkpoint-1000000`` sorts before
    ``checkpoint-999999`` as text, but it is the later checkpoint and must be the one resumed."""
    mgr = CheckpointManager(tmp_path, keep=5)
    for it in (999_999, 1_000_000, 7):
        mgr.save(it, _writer({"it": it}))
    assert [checkpoint_iteration(p) for p in list_checkpoints(tmp_path)] == [7, 999_999, 1_000_000]
    assert latest_checkpoint(tmp_path).name == "checkpoint-1000000"


def test_save_creates_missing_parent_directories(tmp_path):
    """``root`` is usually ``<output_dir>/checkpoints`` of a run whose output directory may not exist yet."""
    root = tmp_path / "run" / "checkpoints"
    path = CheckpointManager(root, keep=1).save(1, _writer({"it": 1}))
    assert path == root / checkpoint_name(1) and (path / COMPLETE_MARKER).is_file()


def test_save_replaces_debris_of_a_crashed_write_of_the_same_iteration(tmp_path):
    """A run that crashed while writing iteration 2 and then saves iteration 2 again must not publish the
    crashed attempt's files; a leftover of a crash mid-re-save (the renamed-away old copy) is cleared too."""
    mgr = CheckpointManager(tmp_path, keep=3)

    def crashing_writer(tmp):
        (tmp / "stale.txt").write_text("from the crashed attempt")
        raise RuntimeError("simulated crash mid-write")

    with pytest.raises(RuntimeError):
        mgr.save(2, crashing_writer)
    path = mgr.save(2, _writer({"it": 2}))
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "state.pt"]
    # A crash between "rename the old copy away" and "delete it" leaves .tmp-old-checkpoint-000002.
    (tmp_path / f".tmp-old-{checkpoint_name(2)}").mkdir()
    (tmp_path / f".tmp-old-{checkpoint_name(2)}" / "stale.txt").write_text("old")
    mgr.save(2, _writer({"it": "again"}))
    assert torch.load(path / "state.pt")["it"] == "again"
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(2)]


def test_marker_is_one_key_per_line_and_independent_of_meta_order(tmp_path):
    """The marker is read by people (``cat COMPLETE``) and compared across runs: one key per line,
    keys sorted, so the same meta gives the same bytes whatever order the caller built it in."""
    a = CheckpointManager(tmp_path / "a", keep=1).save(4, _writer({}), meta={"zeta": 1, "alpha": [2, 3]})
    b = CheckpointManager(tmp_path / "b", keep=1).save(4, _writer({}), meta={"alpha": [2, 3], "zeta": 1})
    text = (a / COMPLETE_MARKER).read_text(encoding="utf-8")
    assert text == (b / COMPLETE_MARKER).read_bytes().decode("utf-8")
    data = json.loads(text)
    files = data.pop("files")  # the checksum of every file the writer made
    assert (
        data == {"alpha": [2, 3], "iteration": 4, "zeta": 1}
        and files
        and all(v.startswith("sha256:") for v in files.values())
    )
    top = [line.split(":")[0].strip() for line in text.splitlines() if line.startswith(' "')]
    assert top == ['"alpha"', '"files"', '"iteration"', '"zeta"']


def test_every_published_file_and_directory_is_fsynced(tmp_path, monkeypatch):
    """Durability: the rename publishes only data already on disk, so every file of the checkpoint,
    its directories and the root are fsynced before ``save`` returns (a power cut cannot leave a
    marker pointing at unwritten files)."""
    import os

    opened: dict[int, str] = {}
    synced: list[str] = []
    real_open, real_fsync = os.open, os.fsync

    def rec_open(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        opened[fd] = os.path.realpath(path)
        return fd

    def rec_fsync(fd):
        synced.append(opened[fd])
        return real_fsync(fd)

    monkeypatch.setattr(os, "open", rec_open)
    monkeypatch.setattr(os, "fsync", rec_fsync)

    def writer(tmp):
        (tmp / "sub").mkdir()
        (tmp / "sub" / "b.bin").write_bytes(b"b")
        (tmp / "a.bin").write_bytes(b"a")

    CheckpointManager(tmp_path, keep=1).save(1, writer)
    tmp = os.path.realpath(tmp_path / f".tmp-{checkpoint_name(1)}")
    want = {os.path.join(tmp, p) for p in ("a.bin", COMPLETE_MARKER, "sub/b.bin")} | {tmp, os.path.join(tmp, "sub")}
    assert want <= set(synced)
    assert os.path.realpath(tmp_path) in synced  # the rename itself


def test_rng_state_of_cuda_is_saved_only_in_use_and_restored_only_where_available(monkeypatch):
    """CUDA generators are captured when CUDA is in use (never initialising it just to read them),
    restored when the loading host has CUDA, and skipped when it has none (a GPU checkpoint resumed on
    a CPU host) or when the checkpoint has none (written on a CPU host). Stand-in ``torch.cuda``
    functions make the branch testable without a GPU."""
    calls = []
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["cuda-state"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda s: calls.append(s))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert "cuda" not in capture_rng_state()  # available but never used: nothing to save
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    state = capture_rng_state()
    assert state["cuda"] == ["cuda-state"]
    restore_rng_state(state)
    assert calls == [["cuda-state"]]
    restore_rng_state({k: v for k, v in state.items() if k != "cuda"})  # CPU-written checkpoint
    assert calls == [["cuda-state"]]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    restore_rng_state(state)  # GPU-written checkpoint on a CPU host
    assert calls == [["cuda-state"]]


def test_rng_state_of_random_random_and_errors_naming_the_generator():
    """``random.Random`` owners are replayed too; an unsupported generator, or a checkpoint written
    before generators were saved by name, fails with the generator's name."""

    class Owner:
        def __init__(self):
            self.rng = random.Random(9)

    owner = Owner()
    gens = find_generators(owner, "env")
    assert list(gens) == ["env.rng"]
    state = capture_rng_state(gens)
    first = [owner.rng.random() for _ in range(3)]
    restore_rng_state(state, gens)
    assert [owner.rng.random() for _ in range(3)] == first
    with pytest.raises(CheckpointError) as err:
        capture_rng_state({"env.bad": object()})
    assert str(err.value) == (
        "cannot checkpoint generator 'env.bad' of type object; expected torch.Generator, numpy Generator or "
        "random.Random"
    )
    with pytest.raises(CheckpointError) as err:
        restore_rng_state({**state, "extra": {"env.bad": 1}}, {"env.bad": object()})
    assert str(err.value) == "cannot restore generator 'env.bad' of type object"
    old = {k: v for k, v in state.items() if k != "extra"}  # an older checkpoint layout
    with pytest.raises(CheckpointError, match=r"no state for random generator 'env.rng' \(saved: \[\]\)"):
        restore_rng_state(old, gens)
    restore_rng_state(old)  # without named generators there is nothing to miss


def test_find_generators_of_objects_without_attributes():
    """Slotted objects and builtins have no ``vars()``: they own no findable generator."""

    class Slotted:
        __slots__ = ("rng",)

    s = Slotted()
    s.rng = torch.Generator()
    assert find_generators(s, "x") == {} and find_generators(3, "x") == {}


def test_a_state_file_naming_a_module_by_its_name_before_the_move_still_loads(tmp_path):
    """Run state written before the modules moved into sub-packages names its dataclasses by the old
    module (``a2c_ppo_acktr.prompts.Answer``): it loads as the class's new home, and a module that
    never existed is still refused."""
    import pickle

    from a2c_ppo_acktr.common.prompts import Answer
    from a2c_ppo_acktr.run.checkpoint import load_pickle

    old = pickle.dumps({"last": Answer("3")}, protocol=2).replace(
        b"a2c_ppo_acktr.common.prompts", b"a2c_ppo_acktr.prompts"
    )
    assert b"a2c_ppo_acktr.prompts\n" in old
    (tmp_path / "old.pkl").write_bytes(old)
    assert load_pickle(tmp_path / "old.pkl") == {"last": Answer("3")}
    (tmp_path / "bad.pkl").write_bytes(old.replace(b"a2c_ppo_acktr.prompts\n", b"a2c_ppo_acktr.nowhere\n"))
    with pytest.raises(CheckpointError):
        load_pickle(tmp_path / "bad.pkl")


def test_pickle_round_trip_and_missing_file(tmp_path):
    """Per-rank state files: a round trip keeps numpy arrays and tuples exact; a missing file is a
    CheckpointError naming it, not a bare FileNotFoundError."""
    from a2c_ppo_acktr.run.checkpoint import load_pickle, save_pickle

    obj = {"numpy": np.random.default_rng(0).bit_generator.state, "arr": np.arange(3), "t": (1, "a")}
    save_pickle(obj, tmp_path / "rng.pkl")
    back = load_pickle(tmp_path / "rng.pkl")
    assert back["numpy"] == obj["numpy"] and back["t"] == (1, "a") and back["arr"].tolist() == [0, 1, 2]
    missing = tmp_path / "rank1.pkl"
    with pytest.raises(CheckpointError) as err:
        load_pickle(missing)
    assert (
        str(err.value)
        == f"checkpoint file {str(missing)!r} is missing; the checkpoint is incomplete or from another run layout"
    )
