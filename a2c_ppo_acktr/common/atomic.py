"""Atomic writes: a file or a directory is either its complete old or its complete new self.

Every write goes to a hidden temporary sibling on the same file system, then one ``rename`` puts it
in place (POSIX guarantees the rename is atomic). A crash or an exception leaves the target as it
was and removes the temporary. ``durable=True`` also flushes the data to disk before the rename, for
files whose loss after a power cut would cost work (checkpoints, saved rollouts); the rest only need
a reader never to see half a file.

* :func:`open_atomic`: a file object to write; :func:`write_text` and :func:`write_json` for the
  common cases;
* :func:`publish_dir`: a finished temporary directory takes the place of another.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterator


def temporary_sibling(path: str | os.PathLike) -> Path:
    """A hidden name beside ``path``, unique to this process: ``.<name>.tmp-<pid>``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


@contextmanager
def open_atomic(
    path: str | os.PathLike, mode: str = "w", *, durable: bool = False, encoding: str = "utf-8"
) -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; on a clean exit it replaces ``path``.

    Args:
        path: The file to write (its directory must exist).
        mode: ``"w"`` (text, ``encoding``) or ``"wb"``.
        durable: fsync the file before the rename and the directory after it.
        encoding: Text mode's encoding.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"open_atomic writes a whole file: mode must be 'w' or 'wb', not {mode!r}")
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with open(tmp, mode, **({} if "b" in mode else {"encoding": encoding})) as f:
            yield f
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str, *, durable: bool = False) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    with open_atomic(path, "w", durable=durable) as f:
        f.write(text)
    return Path(path)


def write_json(
    obj: Any, path: str | os.PathLike, *, indent: int | None = 2, durable: bool = False, **dumps: Any
) -> Path:
    """Write ``json.dumps(obj, indent=indent, **dumps)`` to ``path`` atomically."""
    return write_text(path, json.dumps(obj, indent=indent, **dumps), durable=durable)


def fsync_dir(path: Path) -> None:
    """Flush a directory's entries (a rename inside it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every file and directory under ``path`` to disk (so a rename publishes durable data)."""
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def publish_dir(tmp: Path, target: Path, *, durable: bool = True) -> None:
    """Move the finished directory ``tmp`` to ``target`` (same file system), replacing an existing
    ``target``: the old one is renamed aside first and deleted after, so ``target`` is at every moment
    either the complete old or the complete new directory (or, for an instant, absent).

    Args:
        tmp: The finished directory.
        target: Where it goes; an existing directory there is replaced.
        durable: fsync ``tmp``'s files before the rename and the parent directory after it.
    """
    tmp, target = Path(tmp), Path(target)
    if durable:
        fsync_tree(tmp)
    if target.exists():
        old = target.parent / f".tmp-old-{target.name}"
        if old.exists():
            shutil.rmtree(old)
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old)
    else:
        os.rename(tmp, target)
    if durable:
        fsync_dir(target.parent)
