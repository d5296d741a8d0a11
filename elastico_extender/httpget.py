"""One bounded HTTP(S) GET for every endpoint ElastiCo reads but does not own.

dcgm-exporter, a pod's framework metrics port, a profiled server's counters and the
extender a ``kubectl elastico --server`` names are all answered by software that may be
hung, broken or hostile.  A socket timeout bounds one read only: a server that sends a
byte now and then (of the status line, a header, the TLS handshake or the body) would
hold the caller (an agent's whole window) for as long as it liked.  So the whole GET
ends ``2 * timeout`` seconds after it began: the name lookup runs in a thread waited
for ``timeout`` at most (getaddrinfo has no timeout of its own; at most
:data:`MAX_LOOKUPS` hung ones at once), each of the name's addresses is tried within
what is left, and a watchdog shuts the socket when the TLS handshake and the answer
(status line, headers, body) are not done by then.  The body is refused once it passes
``max_bytes``.

Only a whole ``200`` answer is one.  Informational answers ahead of it (``103 Early
Hints``, ``102``; any 1xx but ``101``) are skipped, at most :data:`MAX_INFORMATIONAL`.
A redirect is not followed (the error names where it pointed: a pod could send the
agent to another service); a connection closed inside the headers, a body short of its
``Content-Length``, a Content-Length that is not one number and a Transfer-Encoding
other than ``chunked`` are refused; and http.client's own errors (a status line that
is not HTTP, a header line too long, a broken chunk) become :class:`OSError` naming the
URL (never a user or password written into it).  No encoding is asked for and one sent
anyway (gzip) is refused.  An IPv6 zone id (``http://[fe80::1%25eth0]:9400/``) names
the interface and is left out of the Host header.  No proxy is used: each of these
endpoints is on the node or named directly.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import ipaddress
import re
import socket
import ssl
import threading
import time
from typing import Any, NamedTuple
from urllib.parse import unquote, urlsplit

__all__ = ["MAX_INFORMATIONAL", "MAX_LOOKUPS", "HTTPStatusError", "get_text", "read_reply", "shown"]

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

    The shutdown wakes a read blocked on it (TLS handshake, status line, headers or body)
    with an end of stream or an error; ``fired`` tells the caller it was the deadline,
    not the server, that ended it.  It holds the socket itself, not the connection:
    http.client lets go of the connection's socket once a reply that closes it has begun."""

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


class _Request(NamedTuple):
    """What one GET needs, all read from its URL before anything is sent."""

    conn: http.client.HTTPConnection  # connected here, not by http.client
    target: str  # the request line's path and query
    host: str  # the name or address to connect to
    tls: ssl.SSLContext | None  # for https://


def _request(url: str, timeout: float) -> _Request:
    """The GET ``url`` asks for; ValueError naming the URL for one that no request can
    carry (checked before connecting)."""
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
    if any(c <= " " or c == "\x7f" for c in parts.hostname):  # http.client's InvalidURL
        raise ValueError(f"{shown(url)!r}: cannot be sent (a space or control in the host)")
    https = parts.scheme == "https"
    # Always a port: without one, http.client reads an IPv6 literal's last group as
    # the port ("::1" became host ":" port 1).
    port = (443 if https else 80) if port is None else port
    host = parts.hostname
    if ":" in host and "%" in host:  # an IPv6 zone id, written "%25eth0" (RFC 6874) or raw
        address, _, zone = host.partition("%")
        host = f"{address}%{unquote(zone.removeprefix('25'))}"
    # The connection's host is the Host header's, where a zone id means nothing.
    header_host = host.partition("%")[0]
    tls = ssl.create_default_context() if https else None
    if tls is not None:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            header_host, port, timeout=timeout, context=tls
        )
    else:
        conn = http.client.HTTPConnection(header_host, port, timeout=timeout)
    conn.response_class = _Answer
    return _Request(conn, target, host, tls)


MAX_LOOKUPS = 4
"""Name lookups running at once, at most.  getaddrinfo cannot be interrupted: a GET
stops waiting for a hung one at its timeout and leaves it to its thread, and while this
many are still hung a GET fails instead of starting another thread."""

_LOOKUPS = threading.BoundedSemaphore(MAX_LOOKUPS)

_Address = tuple[int, tuple[Any, ...]]  # a socket family and an address of that family


def _addresses(host: str, port: int, timeout: float) -> list[_Address]:
    """Where ``host`` is: an IP literal as it is (an IPv6 one's zone id the index of its
    interface), a name looked up within ``timeout`` (TimeoutError past it)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a name
        return _look_up(host, port, timeout)
    if isinstance(address, ipaddress.IPv4Address):
        return [(socket.AF_INET, (host, port))]
    zone = _interface(address.scope_id) if address.scope_id else 0
    return [(socket.AF_INET6, (host.partition("%")[0], port, 0, zone))]


def _interface(zone: str) -> int:
    """The index of the interface an IPv6 zone id names, by name or by number (asked of
    the system here: getaddrinfo takes a name only after a link-local address)."""
    try:
        if zone.isascii() and zone.isdigit():
            socket.if_indextoname(int(zone))  # an OSError when there is none
            return int(zone)
        return socket.if_nametoindex(zone)
    except (OSError, ValueError, OverflowError):  # none, a NUL in it, a number too big
        raise OSError(f"no network interface {zone[:40]!r} (the address's zone id)") from None


def _look_up(name: str, port: int, timeout: float) -> list[_Address]:
    """getaddrinfo in a thread of its own, waited for ``timeout`` seconds at most (it
    asks a resolver that may never answer, and no socket timeout covers it)."""
    ends = time.monotonic() + timeout
    if not _LOOKUPS.acquire(timeout=timeout):
        raise TimeoutError(f"name not looked up: {MAX_LOOKUPS} lookups still hung")
    found: list[_Address] = []
    failed: list[Exception] = []
    done = threading.Event()

    def look_up() -> None:
        try:
            for family, _, _, _, address in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM):
                found.append((family, address))
        except (OSError, UnicodeError) as exc:  # not found; a name IDNA cannot encode
            failed.append(exc)
        finally:
            _LOOKUPS.release()
            done.set()

    threading.Thread(target=look_up, name="httpget-lookup", daemon=True).start()
    if not done.wait(max(0.0, ends - time.monotonic())):
        raise TimeoutError(f"name not looked up within {timeout:g} s")
    if failed:
        raise OSError(f"name not looked up: {failed[0]}")
    if not found:
        raise OSError("no address for the name")
    return found


def _connect(addresses: list[_Address], timeout: float, deadline: float) -> socket.socket:
    """A socket connected to the first of ``addresses`` that answers, each tried within
    ``timeout`` and all by ``deadline`` (``time.monotonic()``): socket.create_connection
    gives each address the whole timeout, so a name's N dead addresses cost N of them."""
    failure = OSError("no address to connect to")
    for family, address in addresses:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.settimeout(min(timeout, left))
        try:
            sock.connect(address)
        except OSError as exc:  # refused, unreachable, timed out: the next one
            sock.close()
            failure = exc
            continue
        sock.settimeout(timeout)
        return sock
    raise failure


def get_text(url: str, timeout: float, *, max_bytes: int, accept: str = "text/plain") -> str:
    """GET ``url`` and decode the body as UTF-8 (undecodable bytes replaced).

    ``timeout`` bounds each socket operation and ``2 * timeout`` the whole answer
    (TimeoutError past it); a body over ``max_bytes`` is a ValueError once that much has
    come; a status other than 200 is an :class:`HTTPStatusError`; anything else that
    goes wrong is an OSError naming the URL."""
    request = _request(url, timeout)
    conn = request.conn
    name = shown(url)
    started = time.monotonic()
    deadline = started + 2 * timeout
    watchdog: _Watchdog | None = None
    reply: http.client.HTTPResponse | None = None
    try:
        # The lookup (within ``timeout``) and connecting (each address within what is
        # left, at most ``timeout``) bound themselves; the watchdog all the rest.
        addresses = _addresses(request.host, conn.port, timeout)
        sock = conn.sock = _connect(addresses, timeout, deadline)
        if request.tls is not None:  # no byte sent yet: the handshake comes below
            sock = conn.sock = request.tls.wrap_socket(
                sock, server_hostname=conn.host, do_handshake_on_connect=False
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("connected too late")
        watchdog = _Watchdog(sock, left)
        if isinstance(sock, ssl.SSLSocket):
            sock.do_handshake()
        conn.request(
            "GET", request.target, headers={"Accept": accept, "Accept-Encoding": "identity"}
        )
        reply = conn.getresponse()
        if reply.status != 200:
            raise HTTPStatusError(name, reply.status, reply.reason, reply.getheader("Location"))
        _check_framing(reply, name)
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


def _check_framing(reply: http.client.HTTPResponse, url: str) -> None:
    """OSError for a body http.client would read as whatever comes until the connection
    closes: it decodes ``chunked`` only when that is the whole Transfer-Encoding, and
    drops a Content-Length that is not one number ("31, 31", "-1")."""
    coding = reply.getheader("Transfer-Encoding")
    if coding is not None and not reply.chunked:
        raise OSError(f"{url}: answer in Transfer-Encoding {coding[:40]!r}, not chunked")
    length = reply.getheader("Content-Length")
    if length is not None and reply.length is None and not reply.chunked:
        raise OSError(f"{url}: answer's Content-Length {length[:40]!r} is not a length")


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
