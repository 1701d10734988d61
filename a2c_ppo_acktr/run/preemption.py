"""Stopping a training run on SIGTERM (SLURM's preemption and time-limit signal), SIGINT (Ctrl-C) or a
``STOP`` file in the run directory.

The first signal only sets a flag: the run finishes the iteration it is in (rollout, update, metrics
row), writes a checkpoint and exits with :data:`PREEMPTED_EXIT_CODE`, so ``--resume auto``
continues exactly where it stopped. A ``STOP`` file (``touch RUN/STOP``) does the same and is removed
when the run stops; it reaches every process of every node whatever the launcher does with signals
(``scripts/batch_vsi.sh`` writes it when SLURM signals the job). A second signal stops at once (exit 130, nothing saved
beyond
the last checkpoint). In a multi-process run the processes agree on the flag after every iteration
(a one-element all-reduce), so all of them stop after the same iteration.

A request the run is waiting on (the rollout server's) does not hold the stop back: it polls
:func:`stop_requested` and gives up within a second of the signal or the file.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Optional

from a2c_ppo_acktr.common.errors import UserError

logger = logging.getLogger(__name__)

# EX_TEMPFAIL ("try again later"): the run saved its state and asks to be continued.
PREEMPTED_EXIT_CODE = 75
STOP_FILE = "STOP"  # in the run directory
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# The stop file is looked at this often by waiting requests (a run directory on a network file
# system answers each look with a metadata request).
STOP_FILE_POLL_S = 0.5
_ACTIVE: list["StopOnSignal"] = []  # the StopOnSignal blocks entered in this process, innermost last


def stop_requested() -> Optional[str]:
    """What asks this process's run to stop (a signal, the stop file), or None; for code that waits
    on something slow inside an iteration and should give up at once (see the module docstring)."""
    for stopper in reversed(_ACTIVE):
        what = stopper.requested()
        if what:
            return what
    return None


class Preempted(Exception):
    """The run stopped on a signal after writing ``checkpoint``; ``exit_code`` is what the entry script returns.

    Args:
        what: What asked to stop (a signal's name, the stop file).
        iteration: The iteration (PPO) or optimizer step (SFT) the checkpoint holds.
        checkpoint: The checkpoint written.
        unit: What ``iteration`` counts, for the message.
        resume: The flag that continues the run, for the message.
    """

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(
        self, what: str, iteration: int, checkpoint: Path, unit: str = "iteration", resume: str = "--resume auto"
    ) -> None:
        super().__init__(
            f"stopped by {what} after {unit} {iteration}; checkpoint {checkpoint} written; continue with {resume}"
        )
        self.checkpoint = checkpoint


class StopFileError(RuntimeError, UserError):
    """A stop request that cannot be removed (a directory that is not empty, a file without permission)."""


def remove_stop_file(path: Path) -> None:
    """Remove the stop request at ``path``: a file, or a directory someone made with ``mkdir`` (when empty).

    Raises:
        StopFileError: it cannot be removed (the message says what to do).
    """
    try:
        if path.is_dir() and not path.is_symlink():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
    except OSError as e:
        raise StopFileError(
            f"the stop request {path} cannot be removed ({e.strerror}); remove it yourself (a run stops when a "
            f"{path.name} "
            "file appears in its directory), then continue the run"
        ) from None


class StopOnSignal:
    """Context manager that turns SIGTERM/SIGINT into a stop request (see the module docstring).
    Outside the main thread (where Python cannot install handlers) it does nothing."""

    def __init__(self, stop_file: Optional[Path] = None) -> None:
        self.signame: Optional[str] = None
        self.stop_file = stop_file
        self._previous: dict[int, object] = {}
        self._file_seen: Optional[str] = None
        self._file_checked = -float("inf")

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signame is not None:
            raise KeyboardInterrupt(f"a second signal ({name}) after {self.signame}: stopping now")
        self.signame = name
        logger.warning(
            "%s received: finishing this iteration, then a checkpoint and exit %d (send it again to stop at once)",
            name,
            PREEMPTED_EXIT_CODE,
        )

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def requested(self) -> Optional[str]:
        """:meth:`_local`, with the stop file looked at most every :data:`STOP_FILE_POLL_S` seconds
        (many request threads ask many times a second)."""
        if self.signame:
            return self.signame
        now = time.monotonic()
        if now - self._file_checked >= STOP_FILE_POLL_S:
            self._file_checked = now
            self._file_seen = self._local()
        return self._file_seen

    def _local(self) -> Optional[str]:
        if self.signame:
            return self.signame
        if self.stop_file is not None and os.path.lexists(self.stop_file):
            return f"the {self.stop_file.name} file"
        return None

    def agreed(self, accelerator) -> Optional[str]:
        """What asks to stop, if anything does on any process (the same answer on every process), else None."""
        local = self._local()
        if accelerator.num_processes <= 1:
            return local
        import torch

        flag = torch.tensor([1.0 if local else 0.0], device=accelerator.device)
        if accelerator.reduce(flag, reduction="sum").item() == 0:
            return None
        return local or "a signal to another process"

    def consume(self, is_main: bool) -> None:
        """Remove the stop file (main process), so the resumed run does not stop at once. One that
        cannot be removed is only warned about here: the checkpoint is written, and the next start
        refuses it with one line."""
        if is_main and self.stop_file is not None:
            try:
                remove_stop_file(self.stop_file)
            except StopFileError as e:
                logger.warning("%s", e)
        self._file_seen, self._file_checked = None, -float("inf")
