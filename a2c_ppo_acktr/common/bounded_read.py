"""HTTP requests within a total deadline and a size limit (the teacher's client and the rollout
engine's), which a stop request interrupts.

A socket timeout bounds each read, not the request: a server that sends its status line, headers
or body a byte at a time, each within the timeout, holds a plain ``urlopen`` for ever. Here every
wait of a request (connect, send, status line and headers, body, an error's body) is a slice of at
most :data:`POLL_S` seconds of one :class:`Deadline`; between slices the deadline and the stop
request are checked, so a request ends within :data:`POLL_S` of either. Name resolution and a TLS
handshake are bounded by the deadline but not sliced. Requests go through ``urllib``'s opener, so
proxy settings (``HTTP_PROXY``, ``NO_PROXY``) apply as before.
"""

from __future__ import annotations

import errno
import functools
import http.client
import io
import selectors
import socket
import time
import urllib.request
from typing import Any, Callable, Optional

# Longest wait between two checks of the deadline and of the stop request.
POLL_S = 0.25


class ReplyTooSlow(TimeoutError):
    """The request was still waiting for its server at the deadline."""


class ReplyTooLarge(ValueError):
    """The reply passed the size limit."""


class RequestAborted(Exception):
    """A stop was requested while the request waited (not an ``OSError``: nothing retries it)."""


class Deadline:
    """The time left to one request, and what may stop it early.

    Args:
        seconds: Total time the request may take, from now.
        should_stop: Returns something true (what asks to stop) when the request must end now.
        poll_s: Longest single wait between checks.
    """

    def __init__(self, seconds: float, should_stop: Optional[Callable[[], Any]] = None, poll_s: float = POLL_S) -> None:
        self.seconds = float(seconds)
        self.at = time.monotonic() + self.seconds
        self.should_stop = should_stop
        self.poll_s = poll_s

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self) -> None:
        """Raise :class:`RequestAborted` when a stop is requested, :class:`ReplyTooSlow` past the deadline."""
        why = self.should_stop() if self.should_stop is not None else None
        if why:
            raise RequestAborted(f"stop requested ({why})")
        if self.remaining() <= 0:
            raise ReplyTooSlow(f"no complete reply within {self.seconds:g} s")

    def slice(self) -> float:
        """The next wait: at most :attr:`poll_s`, never past the deadline (after :meth:`check`)."""
        self.check()
        return max(min(self.remaining(), self.poll_s), 1e-3)


def wait(seconds: float, should_stop: Optional[Callable[[], Any]] = None) -> None:
    """Sleep ``seconds`` (a retry's backoff), ended early by :class:`RequestAborted` when ``should_stop``."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if should_stop is not None and (why := should_stop()):
            raise RequestAborted(f"stop requested ({why})")
        time.sleep(min(left, POLL_S))


# ------------------------------------------------------------------------------------------ sockets
class _SlicedReader(io.RawIOBase):
    """Reads of a socket that wait in slices of a :class:`Deadline` (what ``HTTPResponse`` reads)."""

    def __init__(self, owner: "_SlicedSocket") -> None:
        super().__init__()
        self._owner = owner

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        sock, deadline = self._owner.sock, self._owner.deadline
        while True:
            sock.settimeout(deadline.slice())
            try:
                return sock.recv_into(buffer)
            except (socket.timeout, BlockingIOError, InterruptedError):
                continue

    def close(self) -> None:
        if not self.closed:
            super().close()
            self._owner.release()


class _SlicedSocket:
    """A connected socket (plain or TLS) whose sends and reads wait in slices of a :class:`Deadline`;
    everything else is the socket's own. Closed once it and every reader made from it are closed
    (as ``socket.makefile`` files keep a socket open)."""

    def __init__(self, sock: socket.socket, deadline: Deadline) -> None:
        self.sock, self.deadline = sock, deadline
        self._readers, self._closed = 0, False

    def makefile(self, mode: str = "rb", buffering: Optional[int] = None, **_: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only binary reads go through a deadline, not mode {mode!r}")
        self._readers += 1
        return io.BufferedReader(_SlicedReader(self), buffering or io.DEFAULT_BUFFER_SIZE)

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view:
            self.sock.settimeout(self.deadline.slice())
            try:
                sent = self.sock.send(view[:65536])
            except (socket.timeout, BlockingIOError, InterruptedError):
                continue
            view = view[sent:]

    def release(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self.sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self.sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def _connect(address: tuple[str, int], deadline: Deadline, source_address: Optional[tuple] = None) -> socket.socket:
    """A TCP connection to ``address`` made in slices of ``deadline`` (a server that drops the SYN
    never answers: only the deadline or a stop ends the wait)."""
    host, port = address
    error: Optional[OSError] = None
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            if source_address:
                sock.bind(source_address)
            sock.setblocking(False)
            code = sock.connect_ex(addr)
            with selectors.DefaultSelector() as selector:
                selector.register(sock, selectors.EVENT_WRITE)
                while code in (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK, errno.EINTR):
                    if selector.select(deadline.slice()):
                        code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code not in (0, errno.EISCONN):
                raise OSError(code, f"cannot connect to {host}:{port}: {errno.errorcode.get(code, code)}")
            sock.settimeout(max(deadline.remaining(), 1e-3))  # a TLS handshake's bound
            return sock
        except OSError as e:
            sock.close()
            error = e
        except BaseException:
            sock.close()
            raise
    raise error or OSError(f"cannot resolve {host}:{port}")


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # http.client's own hook for making the socket; a proxy's CONNECT tunnel reads through it too.
        self._create_connection = lambda address, timeout=None, source=None: _SlicedSocket(
            _connect(address, deadline, source), deadline
        )


class _DeadlineHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, deadline: Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline
        self._create_connection = lambda address, timeout=None, source=None: _SlicedSocket(
            _connect(address, deadline, source), deadline
        )

    def connect(self) -> None:
        super().connect()  # TCP (and tunnel) through the sliced socket, then TLS wraps the raw one
        self.sock = _SlicedSocket(self.sock, self._deadline)


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(functools.partial(_DeadlineHTTPConnection, deadline=self._deadline), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> Any:
        return self.do_open(
            functools.partial(_DeadlineHTTPSConnection, deadline=self._deadline), req, context=self._context
        )


def open_within(request: urllib.request.Request, deadline: Deadline, *handlers: urllib.request.BaseHandler) -> Any:
    """``urlopen(request)`` whose every wait is a slice of ``deadline`` (see the module docstring);
    ``handlers`` are added to the opener (a redirect policy). Read the reply with :func:`read_within`
    and an error's with :func:`error_body`, under the same deadline.

    Raises:
        ReplyTooSlow: The deadline passed (possibly inside a ``URLError``'s ``reason``).
        RequestAborted: ``deadline.should_stop`` asked to stop.
        urllib.error.HTTPError, urllib.error.URLError, OSError: As ``urlopen``.
    """
    opener = urllib.request.build_opener(_DeadlineHTTPHandler(deadline), _DeadlineHTTPSHandler(deadline), *handlers)
    deadline.check()
    return opener.open(request, timeout=max(deadline.remaining(), 1e-3))


def timed_out(error: BaseException) -> bool:
    """Whether ``error`` (or the ``reason`` of a ``URLError``) is a deadline passing."""
    return isinstance(error, TimeoutError) or isinstance(getattr(error, "reason", None), TimeoutError)


def read_within(resp: Any, deadline: Deadline, max_bytes: int) -> bytes:
    """The body of ``resp`` (an :func:`open_within` response), read until ``deadline`` passes
    (:class:`ReplyTooSlow`) or ``max_bytes`` (:class:`ReplyTooLarge`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        deadline.check()
        chunk = resp.read1(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(f"the reply is larger than {max_bytes} bytes")
        chunks.append(chunk)


def error_body(error: Any, max_bytes: int) -> str:
    """At most ``max_bytes`` of an ``HTTPError``'s body as text, read under its request's deadline:
    what arrived by then, or ``<no body>`` when nothing could be read (the body only decorates a
    message). A stop request is not swallowed. The error's connection is closed."""
    chunks: list[bytes] = []
    size = 0
    try:
        while size < max_bytes:
            chunk = error.read1(max_bytes - size) if hasattr(error, "read1") else error.read(max_bytes - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except RequestAborted:
        raise
    except Exception:  # noqa: BLE001 - see the docstring
        if not chunks:
            return "<no body>"
    finally:
        try:
            error.close()
        except Exception:  # noqa: BLE001 - closing only frees the socket early
            pass
    return b"".join(chunks).decode("utf-8", "replace")
