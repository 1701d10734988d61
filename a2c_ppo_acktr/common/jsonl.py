"""Reading JSON Lines files, with errors that name the file and the line; writing them atomically.

Two kinds of file, two readers:

- :func:`iter_jsonl` for inputs a user hands us (SFT datasets, VSI-Bench rows): every non-blank line
  must be a JSON object, otherwise :class:`JsonlError` names ``path:line`` and how to fix it.
- :func:`read_log` for append-only logs this package writes while running (``metrics.jsonl``,
  ``trajectories.jsonl``): a run killed in the middle of a write leaves a torn last line, which is
  ignored with a warning (and cut off with ``repair=True`` before appending again); a bad line
  anywhere else is corruption and raises.

:func:`write_jsonl` writes a whole file at once (SFT splits, video-protocol records): a temp file
renamed into place, so a reader never sees half of it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Iterator

from a2c_ppo_acktr.common.atomic import open_atomic
from a2c_ppo_acktr.common.errors import UserError

logger = logging.getLogger(__name__)


class JsonlError(ValueError, UserError):
    """A JSONL line is not a JSON object; the message names ``path:line``."""


def decode_line(raw: bytes, path: Path, lineno: int, fix: str = "") -> str:
    """Line ``lineno`` (from 1) of ``path`` as text: UTF-8, a byte-order mark on line 1 dropped.

    Raises:
        JsonlError: the line is not UTF-8 (the message names ``path:line`` and ends with ``fix``).
    """
    try:
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as e:
        hint = f"; {fix}" if fix else ""
        raise JsonlError(
            f"{path}:{lineno} is not UTF-8 ({e.reason} at byte {e.start}); save the file as UTF-8{hint}"
        ) from e


def _parse(raw: str | bytes, path: Path, lineno: int, fix: str) -> dict:
    hint = f"; {fix}" if fix else ""
    if isinstance(raw, bytes):
        raw = decode_line(raw, path, lineno, fix)
    try:
        row = json.loads(raw)
    except json.JSONDecodeError as e:
        raise JsonlError(f"{path}:{lineno} is not valid JSON ({e.msg} at column {e.colno}){hint}") from e
    except RecursionError:
        raise JsonlError(f"{path}:{lineno} is not valid JSON here (nested too deeply){hint}") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise JsonlError(f"{path}:{lineno} is not valid JSON here ({str(e).split(';')[0]}){hint}") from None
    if not isinstance(row, dict):
        raise JsonlError(f"{path}:{lineno} is a JSON {type(row).__name__}, expected an object{hint}")
    return row


def iter_jsonl(path: str | os.PathLike, fix: str = "") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of ``path`` (numbered from 1).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        JsonlError: a line is not a JSON object (the message ends with ``fix``).
    """
    path = Path(path)
    with open(path, "rb") as f:  # decoded line by line: an encoding error names its line
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, _parse(line, path, lineno, fix)


def read_log(path: str | os.PathLike, repair: bool = False, fix: str = "") -> list[dict]:
    """Rows of an append-only JSONL log; a missing file has none.

    Each row is written with its newline in one call, so a writer killed mid-write leaves a last line
    without its newline: that torn line is ignored with a warning, and with ``repair`` the file is
    truncated to the rows before it (fsync'ed), so that appending continues a well-formed file.

    Raises:
        JsonlError: a complete line (one that ends in a newline) is not a JSON object.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    complete, _, torn = data.rpartition(b"\n")
    rows = [_parse(line, path, n, fix) for n, line in enumerate(complete.split(b"\n"), 1) if line.strip()]
    if torn.strip():
        logger.warning("%s: ignoring a torn last line (%d bytes) left by an interrupted write", path, len(torn))
        if repair:
            with open(path, "r+b") as f:
                f.truncate(len(data) - len(torn))
                f.flush()
                os.fsync(f.fileno())
    return rows


def write_jsonl(rows: Iterable[Any], path: str | os.PathLike) -> Path:
    """Write one JSON value per line (non-ASCII kept), atomically (temp file then rename)."""
    path = Path(path)
    with open_atomic(path) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path
