"""Atomic training checkpoints, RNG capture, and finding the checkpoint to resume from.

A checkpoint is a directory ``<output_dir>/checkpoints/checkpoint-<iteration:06d>/``. It is written
into a hidden temporary sibling (``.tmp-checkpoint-...``), every file is fsynced, a completion marker
(``COMPLETE``) is written last, and only then the directory is renamed into place. A crash at any
point therefore leaves either the previous checkpoints untouched plus a stray temporary directory
(ignored and cleaned on the next save), or a complete new checkpoint. Readers only trust directories
that carry the marker.

What goes into a checkpoint is decided by the caller (:mod:`a2c_ppo_acktr.rl.train`) through a writer
callback; this module only knows how to make the write atomic, how to keep the last K, and how to
capture/restore random-number-generator state.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import logging
import os
import pickle
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from a2c_ppo_acktr.common.atomic import publish_dir
from a2c_ppo_acktr.common.digest import file_sha256
from a2c_ppo_acktr.common.errors import UserError

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "COMPLETE"
CHECKPOINT_PREFIX = "checkpoint-"
_TMP_PREFIX = ".tmp-"
_NAME_RE = re.compile(rf"^{CHECKPOINT_PREFIX}(\d+)$")


class CheckpointError(RuntimeError, UserError):
    """A checkpoint is missing, incomplete, or does not fit the run that tries to load it."""


def checkpoint_name(iteration: int) -> str:
    """Directory name of the checkpoint taken after ``iteration`` iterations."""
    return f"{CHECKPOINT_PREFIX}{iteration:06d}"


def checkpoint_iteration(path: str | os.PathLike) -> int:
    """Iteration number encoded in a checkpoint directory name.

    Raises:
        CheckpointError: ``path`` is not named ``checkpoint-<number>``.
    """
    m = _NAME_RE.match(Path(path).name)
    if m is None:
        raise CheckpointError(
            f"{str(path)!r} is not a checkpoint directory (expected a name like {checkpoint_name(12)!r})"
        )
    return int(m.group(1))


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a checkpoint directory whose write finished (carries the marker)."""
    path = Path(path)
    return path.is_dir() and (path / COMPLETE_MARKER).is_file()


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first. Incomplete or temporary ones are ignored."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME_RE.match(p.name) and is_complete(p)]
    return sorted(found, key=checkpoint_iteration)


def latest_checkpoint(root: str | os.PathLike) -> Optional[Path]:
    """The complete checkpoint with the highest iteration under ``root``, or None."""
    found = list_checkpoints(root)
    return found[-1] if found else None


def latest_intact_checkpoint(root: str | os.PathLike) -> Optional[Path]:
    """The newest complete checkpoint under ``root`` whose files match their checksums, or None; each
    newer one that does not is skipped with a warning naming the bad file."""
    for path in reversed(list_checkpoints(root)):
        problem = verify_checkpoint(path)
        if problem is None:
            return path
        logger.warning("checkpoint %s is damaged (%s); falling back to an earlier one", path, problem)
    return None


def resolve_resume(resume: Optional[str], checkpoints_root: str | os.PathLike) -> Optional[Path]:
    """Turn ``log.resume`` into the checkpoint directory to load (or None to start fresh).

    Args:
        resume: None (fresh start), ``"auto"`` (latest complete checkpoint under
            ``checkpoints_root`` if any, otherwise a fresh start), or a checkpoint directory.
        checkpoints_root: where this run writes its checkpoints.

    Raises:
        CheckpointError: an explicit path that does not exist or was never completed.
    """
    if resume is None:
        return None
    if resume == "auto":
        found = latest_intact_checkpoint(checkpoints_root)
        if found is None and list_checkpoints(checkpoints_root):
            raise CheckpointError(
                f"every checkpoint under {checkpoints_root} is damaged (see the warnings above); restore one from a "
                "backup, "
                "or start afresh with --log.overwrite true"
            )
        return found
    path = Path(resume)
    if not path.is_dir():
        raise CheckpointError(
            f"log.resume={resume!r}: no such checkpoint directory; use --resume auto or a path under {checkpoints_root}"
        )
    if not is_complete(path):
        raise CheckpointError(
            f"log.resume={resume!r} has no {COMPLETE_MARKER} marker: its write was interrupted. "
            f"Resume from an earlier checkpoint ({[p.name for p in list_checkpoints(path.parent)]}) or use --resume "
            "auto"
        )
    require_intact(path, "resume from an earlier checkpoint or use --resume auto")
    return path


def file_checksums(root: Path) -> dict[str, str]:
    """``{relative path: "sha256:<hex>"}`` of every file under ``root`` (the marker itself excluded)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != COMPLETE_MARKER):
        out[path.relative_to(root).as_posix()] = "sha256:" + file_sha256(path)
    return out


def verify_checkpoint(path: str | os.PathLike) -> Optional[str]:
    """What is wrong with complete checkpoint ``path`` (a missing, changed or unreadable file), or
    None when every file matches the checksum its marker recorded. Markers written before checksums
    existed record none: such a checkpoint is accepted unverified."""
    path = Path(path)
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{COMPLETE_MARKER} is unreadable ({e})"
    if not isinstance(marker, dict):
        return f"{COMPLETE_MARKER} is malformed (a JSON object was expected, found {type(marker).__name__})"
    if "files" not in marker:
        return None  # written before checksums existed
    expected = marker["files"]
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        return f"{COMPLETE_MARKER} is malformed (its 'files' entry is not a map of file names to checksums)"
    if not expected:
        # Every checkpoint has files; an empty map would verify nothing and pass whatever is there.
        return f"{COMPLETE_MARKER} is malformed (its 'files' map is empty: it records no checksum)"
    try:
        actual = file_checksums(path)
    except OSError as e:
        return f"a file cannot be read ({e})"
    for name, checksum in sorted(expected.items()):
        if name not in actual:
            return f"{name} is missing"
        if actual[name] != checksum:
            return f"{name} does not match its checksum (truncated or changed since it was written)"
    return None


def require_intact(path: str | os.PathLike, fix: str) -> None:
    """Refuse a training checkpoint (a directory carrying ``COMPLETE``) whose files do not match their
    checksums: :class:`CheckpointError` naming the damaged file, then ``fix``. Anything else (an
    adapter directory, a checkpoint written before checksums) passes."""
    path = Path(path)
    if not (path / COMPLETE_MARKER).is_file():
        return
    problem = verify_checkpoint(path)
    if problem is not None:
        raise CheckpointError(f"checkpoint {path} is damaged: {problem}; {fix}")


def _torch_write_failure(e: BaseException) -> bool:
    """``torch.save`` reports a failed write (a full disk, a quota) as a RuntimeError of its zip writer."""
    return isinstance(e, RuntimeError) and ("PytorchStreamWriter" in str(e) or "file write failed" in str(e))


class CheckpointManager:
    """Writes checkpoints atomically under ``root`` and keeps the last ``keep`` of them.

    In a multi-process run every process calls :meth:`save` (a DeepSpeed engine's
    ``save_checkpoint`` is collective); the main process alone creates, publishes and prunes
    directories. ``barrier`` must then synchronise all processes (``accelerator.wait_for_everyone``);
    the directory must be on a file system all processes share.

    Args:
        root: directory holding ``checkpoint-*`` subdirectories.
        keep: how many complete checkpoints to keep (older ones are deleted after a save).
        is_main: whether this process publishes and prunes.
        barrier: synchronises processes; a no-op in single-process runs.
        guard: called by the main process before it touches the directory and again just before it
            publishes a checkpoint; it raises to stop the save (the run's lock check,
            :func:`a2c_ppo_acktr.run.rundir.confirm_lock`: another run may have taken the directory).
    """

    def __init__(
        self,
        root: str | os.PathLike,
        keep: int,
        is_main: bool = True,
        barrier: Callable[[], None] = lambda: None,
        guard: Callable[[], None] = lambda: None,
    ):
        if keep < 1:
            raise CheckpointError(f"keep={keep}: at least one checkpoint must be kept (log.keep_checkpoints >= 1)")
        self.root = Path(root)
        self.keep = keep
        self.is_main = is_main
        self.barrier = barrier
        self.guard = guard

    def save(self, iteration: int, writer: Callable[[Path], None], meta: Optional[Mapping[str, Any]] = None) -> Path:
        """Write checkpoint ``iteration`` atomically.

        Args:
            iteration: iterations completed; names the directory.
            writer: ``writer(tmp_dir)`` writes the checkpoint's files into ``tmp_dir``. Called on
                every process (it decides itself what non-main processes write).
            meta: JSON-able summary stored in the completion marker.

        Returns:
            The published checkpoint directory.
        """
        target = self.root / checkpoint_name(iteration)
        tmp = self.root / f"{_TMP_PREFIX}{target.name}"
        if self.is_main:
            self.guard()
            self.root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():  # left by an earlier crash
                shutil.rmtree(tmp)
            tmp.mkdir()
        self.barrier()
        try:
            try:
                writer(tmp)
            finally:
                # Every process must reach the barrier even when one writer fails, or the others hang.
                self.barrier()
            if self.is_main:
                marker = {"iteration": iteration, **dict(meta or {}), "files": file_checksums(tmp)}
                (tmp / COMPLETE_MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True), encoding="utf-8")
                try:
                    self.guard()
                except BaseException:
                    # The directory is another run's now, and the temporary name may be its own
                    # write of the same iteration: leave it for that run to publish or clean.
                    tmp = None
                    raise
                publish_dir(
                    tmp, target
                )  # a re-save of the same iteration (final save after a periodic one) replaces it
                self._prune()
        except BaseException as e:  # never leave a half-written temporary directory behind
            if self.is_main and tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if not (isinstance(e, OSError) or _torch_write_failure(e)):
                raise
            # A full disk or quota, a read-only or vanished directory: one line naming the file.
            what = getattr(e, "strerror", None) or str(e).splitlines()[0]
            where = f" ({e.filename})" if getattr(e, "filename", None) else ""
            raise CheckpointError(
                f"writing checkpoint {target.name} into {self.root} failed: {what}{where} "
                f"({type(e).__name__}{', errno ' + str(e.errno) if getattr(e, 'errno', None) else ''}); free space or "
                "fix the directory's "
                "permissions, then continue with --resume auto (the earlier checkpoints are intact)"
            ) from e
        self.barrier()
        return target

    def _prune(self) -> None:
        complete = list_checkpoints(self.root)
        for old in complete[: max(0, len(complete) - self.keep)]:
            if old.is_symlink():  # a link a user made: remove the link, never what it points to
                old.unlink()
            else:
                shutil.rmtree(old)
        # Temporary directories of other iterations are debris from crashed writes.
        for p in self.root.iterdir():
            if p.name.startswith(_TMP_PREFIX) and p.is_dir():
                shutil.rmtree(p)


# ---------------------------------------------------------------------------------------- RNG state
def capture_rng_state(extra: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """Snapshot of every random stream the run draws from.

    Args:
        extra: named generators owned by objects (``torch.Generator`` or ``np.random.Generator``),
            e.g. a minibatch shuffler; saved by name.

    Returns:
        A picklable dict for :func:`restore_rng_state`.
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "extra": {},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    for name, gen in (extra or {}).items():
        state["extra"][name] = _generator_state(gen, name)
    return state


def restore_rng_state(state: Mapping[str, Any], extra: Optional[Mapping[str, Any]] = None) -> None:
    """Restore what :func:`capture_rng_state` saved, including the named generators in ``extra``.

    Raises:
        CheckpointError: a generator in ``extra`` has no saved state (the run's objects changed).
    """
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    saved = state.get("extra", {})
    for name, gen in (extra or {}).items():
        if name not in saved:
            raise CheckpointError(
                f"checkpoint has no state for random generator {name!r} (saved: {sorted(saved)}); it was written by a "
                "different version of the run"
            )
        _set_generator_state(gen, saved[name], name)


def _generator_state(gen: Any, name: str) -> Any:
    if isinstance(gen, torch.Generator):
        return gen.get_state()
    if isinstance(gen, np.random.Generator):
        return gen.bit_generator.state
    if isinstance(gen, random.Random):
        return gen.getstate()
    raise CheckpointError(
        f"cannot checkpoint generator {name!r} of type {type(gen).__name__}; expected torch.Generator, numpy Generator "
        "or random.Random"
    )


def _set_generator_state(gen: Any, state: Any, name: str) -> None:
    if isinstance(gen, torch.Generator):
        gen.set_state(state)
    elif isinstance(gen, np.random.Generator):
        gen.bit_generator.state = state
    elif isinstance(gen, random.Random):
        gen.setstate(state)
    else:
        raise CheckpointError(f"cannot restore generator {name!r} of type {type(gen).__name__}")


def find_generators(obj: Any, prefix: str) -> dict[str, Any]:
    """Random generators held as direct attributes of ``obj`` (e.g. a storage's shuffler).

    Objects that own a generator get it checkpointed without having to expose a state API.
    """
    out: dict[str, Any] = {}
    for key, value in sorted(vars(obj).items()) if hasattr(obj, "__dict__") else []:
        if isinstance(value, (torch.Generator, np.random.Generator, random.Random)):
            out[f"{prefix}.{key}"] = value
    return out


# ---------------------------------------------------------------------------------------- small files
@dataclasses.dataclass
class TensorBox:
    """A torch tensor as a numpy array in a per-rank state file: pickled tensors would need torch's
    own rebuild functions, one of which (``torch.storage._load_from_bytes``) runs a full ``torch.load``."""

    array: np.ndarray
    dtype: str  # torch dtype name, e.g. "uint8", "bool", "float32"


def _box(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return TensorBox(t.numpy().copy(), str(t.dtype).removeprefix("torch."))
    if isinstance(obj, dict):
        return type(obj)((k, _box(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_box(v) for v in obj)
    return obj


def _unbox(obj: Any) -> Any:
    if isinstance(obj, TensorBox):
        return torch.from_numpy(obj.array.copy()).to(getattr(torch, obj.dtype))
    if isinstance(obj, dict):
        return type(obj)((k, _unbox(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(_unbox(v) for v in obj)
    return obj


# What a per-rank state file may name, besides this package's own dataclasses and enums: numpy
# arrays, dtypes and random generators, an OrderedDict. Nothing that runs a command, opens a file or
# imports a module by a name read from the file.
_SAFE_GLOBALS = frozenset(
    {
        ("collections", "OrderedDict"),
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("numpy.random._pickle", "__generator_ctor"),
        ("numpy.random._pickle", "__bit_generator_ctor"),
        ("numpy.random._pickle", "__randomstate_ctor"),
        ("numpy.random._pcg64", "PCG64"),
        ("numpy.random._mt19937", "MT19937"),
        ("numpy.random._philox", "Philox"),
        ("numpy.random._sfc64", "SFC64"),
        ("numpy.random.bit_generator", "SeedSequence"),
        ("numpy.random.bit_generator", "__pyx_unpickle_SeedSequence"),
    }
)


# Modules that moved into sub-packages, by their old names: a state file written before the move
# names its dataclasses by the old module and still loads.
_MOVED_MODULES = {
    **{
        f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.common.{m}"
        for m in ("choices", "errors", "atomic", "jsonl", "bounded_read", "stats", "scoring", "env_ids", "prompts")
    },
    **{f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.config.{m}" for m in ("arguments", "cli")},
    **{
        f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.run.{m}"
        for m in ("rundir", "checkpoint", "distributed", "logger", "preemption")
    },
    **{
        f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.policy.{m}"
        for m in (
            "encoding",
            "temp_predictor",
            "distributions",
            "references",
            "rollout_engine",
            "loading",
            "model",
            "loopback_server",
        )
    },
    **{f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.rl.{m}" for m in ("run_state", "train")},
    **{old: "a2c_ppo_acktr.algo.storage" for old in ("a2c_ppo_acktr.storage", "a2c_ppo_acktr.rl.storage")},
    **{f"a2c_ppo_acktr.{m}": f"a2c_ppo_acktr.eval.{m}" for m in ("evaluation", "validation", "video_protocol")},
    **{old: "a2c_ppo_acktr.rl.saved_rollouts" for old in ("a2c_ppo_acktr.rollouts", "a2c_ppo_acktr.rl.rollouts")},
    **{
        old: f"a2c_ppo_acktr.labels.{m}"
        for m in ("teachers", "labeling")
        for old in (f"a2c_ppo_acktr.{m}", f"a2c_ppo_acktr.eval.{m}")
    },
}


class _StateUnpickler(pickle.Unpickler):
    """Resolves only :data:`_SAFE_GLOBALS`, numpy's dtype classes and this package's own dataclasses
    and enums (under their old module names too, :data:`_MOVED_MODULES`); any other global
    (``os.system``, ``builtins.eval``, ``subprocess.Popen``...) is refused before anything is called."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _SAFE_GLOBALS or (module == "numpy.dtypes" and name.endswith("DType") and "." not in name):
            return super().find_class(module, name)
        module = _MOVED_MODULES.get(module, module)
        if module.startswith("a2c_ppo_acktr.") and "." not in name:
            obj = super().find_class(module, name)
            if isinstance(obj, type) and (dataclasses.is_dataclass(obj) or issubclass(obj, enum.Enum)):
                return obj
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def save_pickle(obj: Any, path: Path) -> None:
    """Write per-rank state (RNG states, env episodes, observations: plain Python, numpy and this
    package's dataclasses; torch tensors are stored as :class:`TensorBox`) for :func:`load_pickle`."""
    with open(path, "wb") as f:
        pickle.dump(_box(obj), f, protocol=pickle.HIGHEST_PROTOCOL)


def load_pickle(path: Path) -> Any:
    """Load a file written by :func:`save_pickle` with a restricted unpickler that runs no code from
    the file (a shared or downloaded checkpoint is untrusted input).

    Raises:
        CheckpointError: the file is missing, unreadable, or names anything outside the allowed types
            (a tampered file, or one written before tensors were boxed: start that run afresh).
    """
    if not path.is_file():
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is missing; the checkpoint is incomplete or from another run layout"
        )
    try:
        with open(path, "rb") as f:
            return _unbox(_StateUnpickler(f).load())
    except pickle.PickleError as e:  # UnpicklingError, or a library's own (numpy's checksum mismatch)
        if str(e).startswith("refusing"):
            raise CheckpointError(
                f"checkpoint file {str(path)!r} was not loaded: {e} (only numpy, RNG and this package's state types "
                "are allowed)"
            ) from e
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is corrupt ({e}); resume from an earlier checkpoint"
        ) from e
    except (
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        ImportError,
        IndexError,
        KeyError,
        OverflowError,
        MemoryError,
        RecursionError,
    ) as e:
        raise CheckpointError(
            f"checkpoint file {str(path)!r} is corrupt ({type(e).__name__}: {e}); resume from an earlier checkpoint"
        ) from e
