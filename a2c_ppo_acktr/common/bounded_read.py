"""Reading an HTTP reply within a total deadline and a size limit (the teacher's client and the
rollout engine's): a server that drips a byte at a time never trips a per-read socket timeout, and
one that sends megabytes is stopped at the limit. Also the body of an error reply, read for its message."""
from __future__ import annotations

import time
from typing import Any


class ReplyTooSlow(TimeoutError):
    """The reply was still arriving at the deadline."""


class ReplyTooLarge(ValueError):
    """The reply passed the size limit."""


def read_within(resp: Any, deadline: float, max_bytes: int) -> bytes:
    """The body of ``resp`` (a ``urllib`` response), read in pieces until ``time.monotonic()``
    passes ``deadline`` (:class:`ReplyTooSlow`) or ``max_bytes`` (:class:`ReplyTooLarge`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            raise ReplyTooSlow("the reply took longer than its deadline")
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(f"the reply is larger than {max_bytes} bytes")
        chunks.append(chunk)


def error_body(error: Any, max_bytes: int) -> str:
    """At most ``max_bytes`` of an ``HTTPError``'s body as text, or ``<no body>`` when it cannot be read
    (the body only decorates a message)."""
    try:
        return error.read(max_bytes).decode("utf-8", "replace")
    except Exception:  # noqa: BLE001 - see the docstring
        return "<no body>"
