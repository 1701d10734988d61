"""Output directories: a guard for the commands that write one, and a lock per run directory.

* :func:`claim_output_dir` refuses a directory that already holds output unless the user asked to
  overwrite; the old directory is then moved aside to ``NAME.old-<time>``, never deleted. It also
  refuses the current directory (or one above it) and a directory that is, holds or lies inside
  one of the command's inputs.
* :class:`RunLock` is an advisory ``flock`` on ``.NAME.lock`` beside the directory (beside, not
  inside, so the lock stays with the path when an overwrite moves the directory away). The file
  records the holder's host, pid, start time and command; a second process gets a one-line error
  naming the holder. The kernel releases the lock of a process that dies, so a lock file left by a
  dead process is taken over (with a log line saying whose it was).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional

from a2c_ppo_acktr.common.redaction import redact_urls
from a2c_ppo_acktr.config.arguments import ConfigError

logger = logging.getLogger(__name__)

# errnos of file systems that do not implement flock (e.g. Lustre mounted without -o flock).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class RunLockedError(ConfigError):
    """Another live process holds the run directory's lock."""


def _contains(parent: Path, child: Path) -> bool:
    """``child`` is ``parent`` or lies inside it (both resolved)."""
    return child == parent or parent in child.parents


def aside_name(path: Path) -> Path:
    """A free ``NAME.old-<time>[-k]`` sibling of ``path``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.old-{stamp}")
    k = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.old-{stamp}-{k}")
        k += 1
    return candidate


def move_aside(path: Path) -> Path:
    """Rename ``path`` to :func:`aside_name` and return the new name (nothing is deleted)."""
    aside = aside_name(path)
    os.rename(path, aside)
    return aside


def check_output_path(out: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), option: str = "--out") -> Path:
    """``out`` resolved, after refusing the current directory (or one above it), a path that is a
    file, and a directory that is, holds or lies inside one of ``inputs`` (paths that do not exist
    are ignored).

    Raises:
        ConfigError: naming the clash and ``option``.
    """
    path = Path(out).expanduser().resolve()
    if _contains(path, Path.cwd().resolve()):
        raise ConfigError(f"{option} {out} is the current directory or contains it; choose a new directory for the output")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {out} is a file, not a directory")
    for given in inputs:
        src = Path(given).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        if _contains(path, src) or _contains(src, path):
            raise ConfigError(f"{option} {out} overlaps the input {given}; write the output to a directory of its own")
    return path


def is_used(path: Path) -> bool:
    """The directory exists and holds anything."""
    return path.is_dir() and any(path.iterdir())


def claim_output_dir(
    out: str | os.PathLike,
    *,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike] = (),
    option: str = "--out",
    overwrite_hint: str = "--overwrite",
    used: Callable[[Path], bool] = is_used,
    create: bool = True,
) -> Path:
    """Check ``out`` (:func:`check_output_path`); if ``used(out)`` refuse it, or with ``overwrite``
    move it aside. Creates the directory when ``create``. Returns the resolved path.

    Raises:
        ConfigError: the path clashes, or holds output and ``overwrite`` is off.
    """
    path = check_output_path(out, inputs, option)
    if used(path):
        if not overwrite:
            raise ConfigError(
                f"{option} {out} already holds output; choose another directory, or pass {overwrite_hint} "
                f"(moves it to {path.name}.old-<time>, nothing is deleted)"
            )
        aside = move_aside(path)
        logger.warning("%s: the output that was in %s was moved to %s", overwrite_hint, path, aside)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def lock_path(directory: str | os.PathLike) -> Path:
    d = Path(directory).expanduser().resolve()
    return d.with_name(f".{d.name}.lock")


class RunLock:
    """Exclusive advisory lock on a run directory (see the module docstring); a context manager.

    Args:
        directory: the run directory (it need not exist yet; its parent is created).
    """

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.path = lock_path(directory)
        self._fd: Optional[int] = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _holder(self) -> dict:
        """The holder's record; {} when the file is empty or not a record (only decoration)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> "RunLock":
        """Take the lock.

        Raises:
            RunLockedError: a live process holds it (the message names its host and pid).
        """
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            h = self._holder()
            who = f"pid {h.get('pid', '?')} on {h.get('host', '?')} (since {h.get('started', '?')})"
            raise RunLockedError(
                f"{self.directory} is in use by another run: {who}; wait for it to end or stop it, or choose another directory "
                f"(lock file {self.path})"
            ) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_LOCKS:
                raise
            logger.warning("the file system of %s has no file locks (%s): running without the run-directory lock", self.path, e.strerror)
            return self
        old = self._holder()
        if old.get("pid"):
            logger.info("taking over the lock of %s: pid %s on %s is gone", self.directory, old.get("pid"), old.get("host"))
        info = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "command": redact_urls(" ".join(sys.argv))[:500]}
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
        self._fd = fd
        return self

    def release(self) -> None:
        """Release the lock (the file stays: removing it would race with a process that opened it)."""
        if self._fd is None:
            return
        import fcntl

        try:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


# What marks a directory as a training run's (PPO or SFT): no report may be written into one.
RUN_MARKERS = ("metrics.jsonl", "checkpoints", "adapter")
# What a single evaluation report leaves (eval_vsi.py's report and its trajectory pictures).
REPORT_MARKERS = ("report.json", "report.md", "trajectories")


def holds_run(path: Path) -> list[str]:
    """The :data:`RUN_MARKERS` present in ``path``."""
    if not path.is_dir():
        return []
    return [m for m in RUN_MARKERS if (path / m).exists()] + sorted(p.name for p in path.glob("checkpoint-*"))[:1]


def claim_report_dir(out: str | os.PathLike, *, overwrite: bool, writes_report: bool = True) -> Path:
    """The directory of an evaluation's output: never a training run's directory; when the command
    writes a report, a directory holding an earlier report is refused unless ``overwrite`` (moved
    aside whole, so no stale trajectory picture survives beside the new report)."""
    path = check_output_path(out)
    found = holds_run(path)
    if found:
        raise ConfigError(f"--out {out} is a training run's directory (it holds {', '.join(found)}); write the report to a directory of its own")
    if not writes_report:
        path.mkdir(parents=True, exist_ok=True)
        return path
    return claim_output_dir(out, overwrite=overwrite, used=lambda p: any((p / m).exists() for m in REPORT_MARKERS))


def run_lock(directory: str | os.PathLike, is_main: bool, num_processes: int = 1) -> RunLock:
    """Take ``directory``'s :class:`RunLock` on the main process and tell every process the outcome
    (a collective when ``num_processes > 1``), so that all of them stop together when another run
    holds it. Returns the lock (held on the main process only); release it when the run ends.

    Raises:
        RunLockedError: on every process, when another live process holds the lock.
    """
    lock = RunLock(directory)
    error = None
    if is_main:
        try:
            lock.acquire()
        except RunLockedError as e:
            error = str(e)
    if num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error])[0]
    if error:
        raise RunLockedError(error)
    return lock


# How long a process looks for the main process's probe file before calling the directory unshared.
SHARED_PROBE_WAIT_S = 10.0


class SharedDirectoryError(ConfigError):
    """Some processes of a run do not see the files another one writes beside the run directory."""


def check_shared_directory(directory: str | os.PathLike, is_main: bool, num_processes: int) -> None:
    """Every process must see a file the main process writes beside ``directory`` (a collective).

    A multi-node run whose output directory is node-local (``/tmp``, a local scratch disk) would
    otherwise fail at its first checkpoint, hours in, or worse, let each node write its own half.
    The main process writes a probe file next to the run lock, every process looks for it, the main
    process removes it. Nothing to check with one process.

    Raises:
        SharedDirectoryError: on every process, naming the processes (and hosts) that did not see it.
    """
    if num_processes <= 1:
        return
    from accelerate.utils import broadcast_object_list, gather_object

    target = Path(directory).expanduser().resolve()
    probe = None
    if is_main:
        target.parent.mkdir(parents=True, exist_ok=True)
        probe = target.parent / f".{target.name}.probe-{socket.gethostname()}-{os.getpid()}-{time.time_ns()}"
        probe.write_text("shared-filesystem probe of a starting run; removed once every process has looked\n", encoding="utf-8")
    name = broadcast_object_list([probe.name if probe is not None else None])[0]
    # A network filesystem may cache "no such file" for a few seconds: look again, listing the
    # directory (which refreshes it), before calling the directory node-local.
    deadline = time.monotonic() + SHARED_PROBE_WAIT_S
    while not (seen := (target.parent / name).exists() or (target.parent.is_dir() and name in os.listdir(target.parent))):
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    everyone = gather_object([(int(os.environ.get("RANK", "0")), socket.gethostname(), seen)])
    if probe is not None:
        probe.unlink(missing_ok=True)
    blind = [(rank, host) for rank, host, ok in everyone if not ok]
    if blind:
        who = ", ".join(f"{rank} on {host}" for rank, host in blind)
        raise SharedDirectoryError(
            f"{target} is not on a filesystem every process sees: process(es) {who} do not see the file the main process "
            f"wrote beside it; put the output directory on a shared filesystem (not /tmp or a node-local disk)"
        )
