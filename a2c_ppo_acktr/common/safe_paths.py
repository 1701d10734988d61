"""Paths built from data stay inside their roots.

A benchmark's rows name scenes and videos, a labelled trajectory names its images: those names come
from files a run did not write, and a name such as ``../../home/me/.ssh/id`` or a symbolic link
inside the data must not make the run read (or copy into a dataset) a file from elsewhere. Each path
built from data is resolved, symbolic links included, and refused when it lands outside its root;
the error is one line naming the row or file that holds the name.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from a2c_ppo_acktr.common.errors import UserError


class PathOutsideRoot(ValueError, UserError):
    """A path built from data leads out of the directory it must stay in."""


def plain_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be one path component (a scene's or a video's name), or None: a
    separator (``/`` or ``\\``), ``.``/``..``, a NUL byte or a drive letter would make it a path."""
    if not name or not name.strip():
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    if name in (".", "..") or len(PurePosixPath(name).parts) != 1 or len(PureWindowsPath(name).parts) != 1:
        return "is a path, not a name (it holds '/', '\\', '..' or a drive)"
    return None


def contained(root: str | os.PathLike, relative: str | os.PathLike, where: str) -> Path:
    """``root / relative``, after checking that it resolves inside ``root`` (both resolved, symbolic
    links followed, the file need not exist yet).

    Args:
        root: The directory the path must stay in.
        relative: The part built from data.
        where: What holds the name, for the message (``"rows.parquet row 12 (id 3) scene_name"``).

    Returns:
        The joined path as written (not resolved), so messages show the layout the user knows.

    Raises:
        PathOutsideRoot: ``relative`` is absolute, or the path resolves outside ``root``.
    """
    rel = Path(relative)
    if rel.is_absolute() or rel.drive:
        raise PathOutsideRoot(f"{where}: {str(relative)!r} is an absolute path; it must be relative to {str(root)!r}")
    return inside(root, Path(root) / rel, where, shown=str(relative))


def inside(root: str | os.PathLike, path: str | os.PathLike, where: str, shown: str | None = None) -> Path:
    """``path`` (under ``root`` as written), after checking that it resolves inside ``root``: see
    :func:`contained`, for a path already joined. ``shown`` is how the message names it."""
    path = Path(path)
    shown = str(path) if shown is None else shown
    try:
        real_root, real = Path(root).resolve(), path.resolve()
    except (OSError, RuntimeError) as e:  # a symbolic link loop
        raise PathOutsideRoot(
            f"{where}: {shown!r} under {str(root)!r} cannot be resolved ({e}); fix the links"
        ) from None
    if real != real_root and real_root not in real.parents:
        link = " (through a symbolic link)" if ".." not in Path(shown).parts else ""
        raise PathOutsideRoot(
            f"{where}: {shown!r} leads to {str(real)!r}, outside {str(real_root)!r}{link}; "
            "data may only name files inside its root: fix the name or the link, or move the files under the root"
        )
    return path
