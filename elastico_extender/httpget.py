"""One bounded HTTP(S) GET for every endpoint ElastiCo reads but does not own.

dcgm-exporter, a pod's framework metrics port, a profiled server's counters and the
extender a ``kubectl elastico --server`` names are all answered by software that may be
hung, broken or hostile.  A socket timeout bounds one read only: a server that sends a
byte now and then (of the status line, a header, the TLS handshake or the body) would
hold the caller (an agent's whole window) for as long as it liked.  Here a watchdog
shuts the connection's socket when the answer (status line, headers, body) is not
complete ``2 * timeout`` seconds after the request began, and the body is refused once
it passes ``max_bytes``.

Only a whole ``200`` answer is one.  A redirect is not followed (the error names where
it pointed: a pod could send the agent to another service), a body short of its
``Content-Length`` is refused, and http.client's own errors (a status line that is not
HTTP, a header line too long, a broken chunk) become :class:`OSError` naming the URL
(never a user or password written into it).  No encoding is asked for and one sent
anyway (gzip) is refused.  No proxy is used: each of these endpoints is on the node or
named directly.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import re
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

__all__ = ["MAX_INFORMATIONAL", "HTTPStatusError", "get_text", "read_reply", "shown"]

MAX_INFORMATIONAL = 16
"""Informational answers (1xx but 101) skipped ahead of the answer; one more is an error."""


class HTTPStatusError(OSError):
    """The server answered with a status other than 200 (``status`` holds it)."""

    def __init__(self, url: str, status: int, reason: str, location: str | None) -> None:
        where = f" (to {location[:200]!r}, not followed)" if location else ""
        super().__init__(f"{url}: HTTP {status} {reason[:100]}{where}")
        self.status = status


class _Watchdog:
    """Shuts ``sock`` down ``seconds`` from now unless cancelled first.

    The shutdown wakes a read blocked on it (status line, headers or body) with an end
    of stream or an error; ``fired`` tells the caller it was the deadline, not the
    server, that ended it.  It holds the socket itself, not the connection: http.client
    lets go of the connection's socket once a reply that closes it has begun."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._finished = False
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        with self._lock:
            if self._finished:
                return
            self.fired = True
            # socket.socket's own shutdown: SSLSocket's would unwrap under the reader
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        """Called before the socket is closed, so the shutdown never meets a closed one."""
        with self._lock:
            self._finished = True
        self._timer.cancel()


class _Lines(io.BufferedReader):
    """An answer's bytes, remembering the last line read: http.client ends a header
    block at the end of the stream just as at the blank line that ends a whole one."""

    last = b""

    def readline(self, size: int | None = -1, /) -> bytes:
        self.last = super().readline(size)
        return self.last


class _Answer(http.client.HTTPResponse):
    """http.client's reading of an answer, less what it misreads in real servers' answers.

    It skips only ``100 Continue``: a ``103 Early Hints`` (or ``102 Processing``) ahead
    of the answer became the answer.  Every informational answer but ``101`` (nothing
    asked to switch protocols) is skipped here, at most :data:`MAX_INFORMATIONAL` of them
    (the watchdog's deadline bounds the ``100`` s http.client skips itself).  And a
    connection closed inside the headers was a whole answer with no body (an empty
    200, "no data"): here it is an error."""

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self._lines = _Lines(self.fp.detach())  # nothing read yet: no byte lost
        self.fp = self._lines

    def begin(self) -> None:
        for _ in range(MAX_INFORMATIONAL + 1):
            super().begin()
            if self._lines.last not in (b"\r\n", b"\n"):
                raise OSError("connection closed before the answer's headers ended")
            if not 100 <= self.status < 200 or self.status == 101:
                return
            self.headers = None  # type: ignore[assignment]  # begin() reads the next one
        raise OSError(f"more than {MAX_INFORMATIONAL} informational (1xx) answers, no answer")


_CREDENTIALS = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/?#@]*@")


def shown(url: str) -> str:
    """``url`` as an error or a log line may show it: without a user or password, and at
    most 200 characters."""
    return _CREDENTIALS.sub(r"\1", url)[:200]


def _connection(url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """The connection for ``url`` and the target its request line names; ValueError
    naming the URL for one that no request can carry (checked before connecting)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "[::1" unclosed, a port that is not a number or too big
        raise ValueError(f"{shown(url)!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{shown(url)!r}: not an http:// or https:// URL with a host")
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if not target.isascii() or any(c <= " " or c == "\x7f" for c in target):
        raise ValueError(f"{shown(url)!r}: cannot be sent (a path of plain ASCII, encoded)")
    https = parts.scheme == "https"
    # Always a port: without one, http.client reads an IPv6 literal's last group as
    # the port ("::1" became host ":" port 1).
    port = (443 if https else 80) if port is None else port
    if https:
        context = ssl.create_default_context()
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname, port, timeout=timeout, context=context
        )
    else:
        conn = http.client.HTTPConnection(parts.hostname, port, timeout=timeout)
    conn.response_class = _Answer
    return conn, target


def get_text(url: str, timeout: float, *, max_bytes: int, accept: str = "text/plain") -> str:
    """GET ``url`` and decode the body as UTF-8 (undecodable bytes replaced).

    ``timeout`` bounds each socket operation and ``2 * timeout`` the whole answer
    (TimeoutError past it); a body over ``max_bytes`` is a ValueError once that much has
    come; a status other than 200 is an :class:`HTTPStatusError`; anything else that
    goes wrong is an OSError naming the URL."""
    conn, target = _connection(url, timeout)
    name = shown(url)
    started = time.monotonic()
    watchdog: _Watchdog | None = None
    reply: http.client.HTTPResponse | None = None
    try:
        # Connecting (each address within ``timeout``) and the TLS handshake (CPython
        # gives the whole handshake one deadline of ``timeout``) bound themselves.
        conn.connect()
        left = started + 2 * timeout - time.monotonic()
        if left <= 0:
            raise TimeoutError("connected too late")
        assert conn.sock is not None  # connect() sets it or raises
        watchdog = _Watchdog(conn.sock, left)
        conn.request("GET", target, headers={"Accept": accept, "Accept-Encoding": "identity"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise HTTPStatusError(name, reply.status, reply.reason, reply.getheader("Location"))
        encoding = (reply.getheader("Content-Encoding") or "identity").strip()
        if encoding.lower() != "identity":  # bytes no reader here can decode as text
            raise OSError(f"{name}: answer in Content-Encoding {encoding[:40]!r}, asked for none")
        body = read_reply(reply, name, started, 2 * timeout, max_bytes)
        if reply.length:  # the connection closed before Content-Length bytes came
            raise OSError(f"{name}: answer cut short, {reply.length} bytes missing")
    except (OSError, ValueError, http.client.HTTPException) as exc:
        if watchdog is not None and watchdog.fired:
            raise _late(name, timeout) from None
        if isinstance(exc, http.client.HTTPException):
            message = f"{name}: not an HTTP answer: {type(exc).__name__}: {exc}"
            raise OSError(message[:300]) from exc
        if isinstance(exc, TimeoutError):  # a socket's own per-operation timeout
            raise TimeoutError(f"{name}: {exc}") from None
        if isinstance(exc, OSError) and name not in str(exc):  # refused, reset, TLS, DNS
            raise OSError(f"{name}: {exc}") from exc
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if reply is not None:
            reply.close()
        conn.close()
    if watchdog is not None and watchdog.fired:  # its shutdown may have ended the body
        raise _late(name, timeout)
    return body.decode("utf-8", errors="replace")


def _late(url: str, timeout: float) -> TimeoutError:
    return TimeoutError(f"{url}: answer not complete after {2 * timeout:g} s")


def read_reply(reply: Any, url: str, started: float, timeout: float, max_bytes: int) -> bytes:
    """The body of an HTTP answer (http.client's or urllib3's: anything with ``read1``),
    read in pieces: ValueError once it passes ``max_bytes``, TimeoutError when it is
    still coming ``timeout`` seconds after ``started`` (``time.monotonic()``)."""
    deadline = started + timeout
    parts: list[bytes] = []
    size = 0
    while chunk := reply.read1(65536):
        parts.append(chunk)
        size += len(chunk)
        if size > max_bytes:
            raise ValueError(f"{url}: answer larger than {max_bytes} bytes")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}: answer not complete after {timeout:g} s")
    return b"".join(parts)
