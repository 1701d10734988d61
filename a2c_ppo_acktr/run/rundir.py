"""Output directories: one guard for every command that writes a directory or files, and a lock per
output directory.

* :func:`claim_output_dir` refuses a directory that already holds output unless the user asked to
  overwrite; the old directory is then moved aside to ``NAME.old-<time>``, never deleted.
  :func:`claim_output_files` does the same for named files in a folder that may hold the user's own
  (each file moved aside on its own). Both refuse the current directory (or one above it), a path
  that is, holds or lies inside one of the command's inputs, a path ending in ``..`` and a name that
  is not UTF-8, and both respect a live process's lock: nothing is moved while another process
  holds the directory.
* :class:`RunLock` is an advisory ``flock`` on ``.NAME.lock`` beside the directory (beside, not
  inside, so the lock stays with the path when an overwrite moves the directory away). The file
  records the holder's host, pid, start time and command; a second process gets a one-line error
  naming the holder. The kernel releases the lock of a process that dies, so a lock file left by a
  dead process is taken over (with a log line saying whose it was). A lock lives on the open file,
  not on the name: if someone deletes the file, a second process could lock a new one. The holder
  therefore checks, before each checkpoint and before it moves anything aside
  (:meth:`RunLock.confirm`), that the file on disk is still the one it locked; a vanished file is
  taken back, and one that another process now holds stops this process with one line
  (:class:`RunLockLostError`) before it writes over that process's files.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional, Sequence

from a2c_ppo_acktr.common.redaction import redact_urls
from a2c_ppo_acktr.config.arguments import ConfigError

logger = logging.getLogger(__name__)

# errnos of file systems that do not implement flock (e.g. Lustre mounted without -o flock).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS})


class RunLockedError(ConfigError):
    """Another live process holds the run directory's lock."""


class RunLockLostError(RunLockedError):
    """The lock file was removed while this process held it, and another process now holds a new one."""


def _contains(parent: Path, child: Path) -> bool:
    """``child`` is ``parent`` or lies inside it (both resolved)."""
    return child == parent or parent in child.parents


def free_name(path: Path) -> Path:
    """``path`` itself, or ``path-1``, ``path-2``... : the first that names nothing, not even a broken link."""
    candidate, k = path, 1
    while os.path.lexists(candidate):
        candidate = path.with_name(f"{path.name}-{k}")
        k += 1
    return candidate


def aside_name(path: Path) -> Path:
    """A free ``NAME.old-<time>[-k]`` sibling of ``path``."""
    return free_name(path.with_name(f"{path.name}.old-{time.strftime('%Y%m%d-%H%M%S')}"))


def move_aside(path: Path) -> Path:
    """Rename ``path`` to :func:`aside_name` and return the new name (nothing is deleted). A lock this
    process holds on ``path`` is confirmed first (:meth:`RunLock.confirm`)."""
    confirm_lock(path)
    aside = aside_name(path)
    os.rename(path, aside)
    return aside


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_output_path(out: str | os.PathLike, inputs: Iterable[str | os.PathLike] = (), option: str = "--out") -> Path:
    """``out`` resolved, after refusing a name that is not UTF-8 or ends in ``..``, the current
    directory (or one above it), a path that is a file, and a directory that is, holds or lies inside
    one of ``inputs`` (paths that do not exist are ignored).

    Raises:
        ConfigError: naming the clash and ``option``.
    """
    shown = os.fsdecode(out)
    if not _utf8(shown):
        # Configs, reports and datasets record the output path as text (UTF-8).
        raise ConfigError(f"{option} {ascii(shown)} is not UTF-8 text; choose a directory name of UTF-8 characters")
    path = Path(shown).expanduser().resolve()
    if _contains(path, Path.cwd().resolve()):
        raise ConfigError(
            f"{option} {shown} is the current directory or contains it; choose a new directory for the output"
        )
    if Path(shown).name == "..":
        # The run's own name would be "..": moving it aside, or its lock beside it, cannot work.
        raise ConfigError(f"{option} {shown} ends in '..'; name the directory itself ({path})")
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option} {shown} is a file, not a directory")
    for given in inputs:
        src = Path(given).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        if _contains(path, src) or _contains(src, path):
            raise ConfigError(
                f"{option} {shown} overlaps the input {given}; write the output to a directory of its own"
            )
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

    Runs under the directory's lock: the one this process holds (confirmed), or one taken for the
    moment of the claim, so a directory another live process holds is refused, used or not.

    Raises:
        ConfigError: the path clashes, or holds output and ``overwrite`` is off.
        RunLockedError: another live process holds the directory.
    """
    inputs = list(inputs)
    path = check_output_path(out, inputs, option)
    with directory_lock(path):
        if used(path):
            if not overwrite:
                raise ConfigError(
                    f"{option} {os.fsdecode(out)} already holds output; choose another directory, or pass "
                    f"{overwrite_hint} "
                    f"(moves it to {path.name}.old-<time>, nothing is deleted)"
                )
            aside = move_aside(path)
            logger.warning("%s: the output that was in %s was moved to %s", overwrite_hint, path, aside)
        if create:
            path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def staged_output_dir(
    out: str | os.PathLike,
    target: Path,
    *,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike] = (),
    prefix: str = ".tmp-",
) -> Iterator[Path]:
    """A temporary sibling of ``target`` to fill in the block; when the block ends cleanly ``out`` is
    claimed (:func:`claim_output_dir`: refused, or moved aside with ``overwrite``) and the sibling is
    renamed into place. Any failure removes the sibling and nothing else."""
    import shutil
    import tempfile

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{target.name}-", dir=target.parent))
    try:
        yield tmp
        claim_output_dir(out, overwrite=overwrite, inputs=inputs, create=False)
        if target.exists():  # an empty directory the user made
            target.rmdir()
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def claim_output_files(
    directory: str | os.PathLike,
    names: Sequence[str],
    *,
    overwrite: bool,
    inputs: Iterable[str | os.PathLike] = (),
    option: str = "--out",
    overwrite_hint: str = "--overwrite",
) -> Path:
    """The folder ``directory`` (created) for a command that writes the files ``names`` into a folder
    that may hold other files of the user's: a name already there is refused, or with ``overwrite``
    moved aside to ``NAME.old-<time>`` (each file on its own; the folder's other files stay). Runs
    under the folder's lock, as :func:`claim_output_dir`.

    Raises:
        ConfigError: the folder clashes (:func:`check_output_path`), or a name is taken and
            ``overwrite`` is off.
        RunLockedError: another live process holds the folder.
    """
    path = check_output_path(directory, inputs, option)
    with directory_lock(path):
        taken = [n for n in names if os.path.lexists(path / n)]
        if taken and not overwrite:
            raise ConfigError(
                f"{option} {os.fsdecode(directory)} already holds {', '.join(taken)}; choose another directory, or "
                "pass "
                f"{overwrite_hint} (moves each to NAME.old-<time>, nothing is deleted)"
            )
        for name in taken:
            aside = aside_name(path / name)
            os.rename(path / name, aside)
            logger.warning("%s: %s was moved to %s", overwrite_hint, path / name, aside)
        path.mkdir(parents=True, exist_ok=True)
    return path


def lock_path(directory: str | os.PathLike) -> Path:
    d = Path(directory).expanduser().resolve()
    return d.with_name(f".{d.name}.lock")


# The locks this process holds, by lock file: a claim or a move inside a directory this process
# holds confirms that lock instead of taking a second one (flock refuses a second open of the file
# even within one process).
_HELD: dict[Path, "RunLock"] = {}


def _same_file(fd: int, path: Path) -> bool:
    """``path`` names the file open on ``fd`` (not removed, not replaced by another file)."""
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (mine.st_dev, mine.st_ino)


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

    def _who(self) -> str:
        h = self._holder()
        return f"pid {h.get('pid', '?')} on {h.get('host', '?')} (since {h.get('started', '?')})"

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise ConfigError(
                f"the lock file {self.path} of {self.directory} is a directory; remove it (rmdir {self.path}) if it "
                "holds "
                "nothing of yours, then run again"
            ) from None

    def acquire(self) -> "RunLock":
        """Take the lock.

        Raises:
            RunLockedError: a live process holds it (the message names its host and pid).
            ConfigError: the lock file's path is a directory.
        """
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunLockedError(
                    f"{self.directory} is in use by another run: {self._who()}; wait for it to end or stop it, or "
                    "choose another "
                    f"directory (lock file {self.path})"
                ) from None
            except OSError as e:
                os.close(fd)
                if e.errno not in _NO_LOCKS:
                    raise
                logger.warning(
                    "the file system of %s has no file locks (%s): running without the run-directory lock",
                    self.path,
                    e.strerror,
                )
                return self
            # The file may have been removed or replaced between the open and the lock: a lock on a
            # file nobody else will open protects nothing, so lock the one the name points to now.
            if _same_file(fd, self.path):
                break
            os.close(fd)
        else:
            raise RunLockedError(
                f"the lock file {self.path} keeps being removed or replaced; find what deletes it and stop it, then "
                "run again"
            )
        old = self._holder()
        if old.get("pid"):
            logger.info(
                "taking over the lock of %s: pid %s on %s is gone", self.directory, old.get("pid"), old.get("host")
            )
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": redact_urls(" ".join(sys.argv))[:500],
        }
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(info).encode("utf-8"))
        self._fd = fd
        _HELD[self.path] = self
        return self

    def confirm(self) -> None:
        """Make sure the lock file on disk is still the one this process locked (a no-op when the
        lock is not held). A file that was removed or replaced is locked again; if another process
        holds the file now there, this process must stop.

        Raises:
            RunLockLostError: another process holds the lock file now at the path (named in the message).
        """
        if self._fd is None or _same_file(self._fd, self.path):
            return
        lost = self._fd
        self._fd = None
        _HELD.pop(self.path, None)
        try:
            self.acquire()
        except RunLockedError:
            raise RunLockLostError(
                f"the lock file {self.path} was removed while this process held {self.directory}, and another process "
                "now "
                f"holds a new one: {self._who()}; this process stops here without writing into the directory again "
                "(let one "
                "run use a directory at a time; never delete a live run's lock file)"
            ) from None
        finally:
            os.close(lost)  # after the new lock is held: the directory is never unguarded in between
        logger.warning(
            "the lock file %s was removed while this process held %s; it is locked again", self.path, self.directory
        )

    def release(self) -> None:
        """Release the lock (the file stays: removing it would race with a process that opened it)."""
        if self._fd is None:
            return
        import fcntl

        _HELD.pop(self.path, None)
        try:
            if _same_file(self._fd, self.path):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def held_lock(directory: str | os.PathLike) -> Optional[RunLock]:
    """The lock this process holds on ``directory``, or None."""
    return _HELD.get(lock_path(directory))


def confirm_lock(directory: str | os.PathLike) -> None:
    """:meth:`RunLock.confirm` the lock this process holds on ``directory`` (nothing when it holds none)."""
    lock = held_lock(directory)
    if lock is not None:
        lock.confirm()


@contextmanager
def directory_lock(directory: str | os.PathLike) -> Iterator[RunLock]:
    """The lock this process holds on ``directory`` (confirmed), or a new one held for the ``with`` block.

    Raises:
        RunLockedError: another live process holds it.
    """
    lock = held_lock(directory)
    if lock is not None:
        lock.confirm()
        yield lock
        return
    with RunLock(directory) as lock:
        yield lock


# What marks a directory as a training run's (PPO or SFT): no report may be written into one.
RUN_MARKERS = ("metrics.jsonl", "checkpoints", "adapter")
# What a single evaluation report leaves (eval_vsi.py's report and its trajectory pictures).
REPORT_MARKERS = ("report.json", "report.md", "trajectories")


def holds_run(path: Path) -> list[str]:
    """The :data:`RUN_MARKERS` present in ``path``."""
    if not path.is_dir():
        return []
    return [m for m in RUN_MARKERS if (path / m).exists()] + sorted(p.name for p in path.glob("checkpoint-*"))[:1]


def claim_report_dir(out: str | os.PathLike, *, overwrite: bool, files: Optional[Sequence[str]] = None) -> Path:
    """The directory of an evaluation's output: never a training run's directory. A command that
    writes a report claims the directory: one holding an earlier report is refused unless
    ``overwrite`` (moved aside whole, so no stale trajectory picture survives beside the new report).
    A command that writes only ``files`` (a comparison, learning curves) beside what the folder
    holds claims those names (:func:`claim_output_files`)."""
    path = check_output_path(out)
    found = holds_run(path)
    if found:
        raise ConfigError(
            f"--out {out} is a training run's directory (it holds {', '.join(found)}); write the report to a directory "
            "of its own"
        )
    if files is not None:
        return claim_output_files(out, files, overwrite=overwrite)
    return claim_output_dir(out, overwrite=overwrite, used=lambda p: any((p / m).exists() for m in REPORT_MARKERS))


def run_lock(directory: str | os.PathLike, is_main: bool, num_processes: int = 1) -> RunLock:
    """Take ``directory``'s :class:`RunLock` on the main process and tell every process the outcome
    (a collective when ``num_processes > 1``), so that all of them stop together when another run
    holds it. Returns the lock (held on the main process only); release it when the run ends.

    Raises:
        RunLockedError: on every process, when another live process holds the lock.
        ConfigError: on every process, when the lock file cannot be made (its path is a directory).
    """
    lock = RunLock(directory)
    return _agreed(lock.acquire, is_main, num_processes, lock)


def confirm_run_lock(directory: str | os.PathLike, is_main: bool, num_processes: int = 1) -> None:
    """:func:`confirm_lock` on the main process, the outcome told to every process (a collective when
    ``num_processes > 1``), so that all of them stop together when another run took the directory.

    Raises:
        RunLockLostError: on every process, when another process now holds the directory's lock file.
    """
    _agreed(lambda: confirm_lock(directory), is_main, num_processes, None)


def _agreed(step: Callable[[], object], is_main: bool, num_processes: int, result: object) -> object:
    """Run ``step`` on the main process; every process raises the error it raised, of the same class."""
    error = None
    if is_main:
        try:
            step()
        except ConfigError as e:
            error = (type(e).__name__, str(e))
    if num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error])[0]
    if error:
        kind = {c.__name__: c for c in (RunLockLostError, RunLockedError)}.get(error[0], ConfigError)
        raise kind(error[1])
    return result


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
        probe.write_text(
            "shared-filesystem probe of a starting run; removed once every process has looked\n", encoding="utf-8"
        )
    name = broadcast_object_list([probe.name if probe is not None else None])[0]
    # A network filesystem may cache "no such file" for a few seconds: look again, listing the
    # directory (which refreshes it), before calling the directory node-local.
    deadline = time.monotonic() + SHARED_PROBE_WAIT_S
    while not (
        seen := (target.parent / name).exists() or (target.parent.is_dir() and name in os.listdir(target.parent))
    ):
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
            f"{target} is not on a filesystem every process sees: process(es) {who} do not see the file the main "
            "process "
            f"wrote beside it; put the output directory on a shared filesystem (not /tmp or a node-local disk)"
        )
