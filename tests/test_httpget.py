"""``httpget.get_text`` against answers real servers give and lookups that hang: each
server is a real socket on loopback, each lookup the real code path with only
``socket.getaddrinfo`` replaced for one made-up name."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_agent_hostile_inputs import RawEndpoint

from elastico_extender import httpget
from elastico_extender.httpget import HTTPStatusError, get_text

BODY = b"vllm:generation_tokens_total 5\n"
WHOLE = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
NAME = "metrics.test"  # a reserved top-level domain: no real lookup ever answers it


def fetch(answer: Callable[[socket.socket], None], timeout: float = 2.0) -> str:
    endpoint = RawEndpoint(answer)
    try:
        return get_text(f"http://127.0.0.1:{endpoint.port}/metrics", timeout, max_bytes=1 << 20)
    finally:
        endpoint.close()


@pytest.mark.parametrize(
    "before",
    [
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 102 Processing\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\n\r\n" * 3,
        b"HTTP/1.1 199 Whatever\n\n",  # bare LF line ends, an unregistered 1xx
    ],
    ids=["103", "102", "100-and-103s", "199-lf"],
)
def test_informational_answers_before_the_200_are_skipped(before: bytes) -> None:
    """Only 100 Continue was skipped: a 103 Early Hints (sent by real servers and
    proxies ahead of the answer) was refused as "HTTP 103"."""
    assert fetch(lambda conn: conn.sendall(before + WHOLE)) == BODY.decode()


def test_a_101_is_not_skipped_nothing_asked_to_switch_protocols() -> None:
    with pytest.raises(HTTPStatusError, match="HTTP 101") as caught:
        fetch(lambda conn: conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\n\r\n" + WHOLE))
    assert caught.value.status == 101


def early_hints_forever(pause: float) -> Callable[[socket.socket], None]:
    """103s, one every ``pause`` seconds, for ten seconds at most: never the answer."""

    def answer(conn: socket.socket) -> None:
        ends = time.monotonic() + 10.0
        for _ in range(100_000):
            if time.monotonic() > ends:
                return
            conn.sendall(b"HTTP/1.1 103 Early Hints\r\n\r\n")
            time.sleep(pause)

    return answer


@pytest.mark.parametrize("pause", [0.05, 0.0], ids=["trickled", "flooded"])
def test_endless_informational_answers_are_cut(pause: float) -> None:
    started = time.monotonic()
    with pytest.raises(OSError, match=r"127\.0\.0\.1.*(informational|not complete after 1 s)"):
        fetch(early_hints_forever(pause), timeout=0.5)
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK",
        b"HTTP/1.1 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Ty",
        b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n",
    ],
    ids=["status-line-unended", "status-line", "header-lines", "header-line-cut", "in-a-103"],
)
def test_a_connection_closed_inside_the_headers_is_an_error_not_an_empty_200(
    answer: bytes,
) -> None:
    """http.client ends a header block at the end of the stream as at a blank line, so
    a server closing before its headers ended was an empty 200: "no data", not an error."""
    with pytest.raises(OSError, match=r"127\.0\.0\.1:\d+/metrics: .*headers") as caught:
        fetch(lambda conn: conn.sendall(answer))
    assert not isinstance(caught.value, HTTPStatusError)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n40\r\nvllm:gen",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nvllm:\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + BODY,
    ],
    ids=["chunk-cut", "last-chunk-missing", "short-of-content-length"],
)
def test_a_body_cut_short_is_still_an_error(answer: bytes) -> None:
    with pytest.raises(OSError, match=r"127\.0\.0\.1:\d+/metrics"):
        fetch(lambda conn: conn.sendall(answer))


@pytest.mark.parametrize(
    ("header", "refused"),
    [
        (b"Transfer-Encoding: gzip, chunked", "Transfer-Encoding 'gzip, chunked'"),
        (b"Transfer-Encoding: identity", "Transfer-Encoding 'identity'"),
        (b"Content-Length: 31, 31", "Content-Length '31, 31'"),
        (b"Content-Length: -1", "Content-Length '-1'"),
        (b"Content-Length: 0x1f", "Content-Length '0x1f'"),
    ],
    ids=["gzip-chunked", "identity", "length-list", "length-negative", "length-hex"],
)
def test_an_answer_framed_in_a_way_http_client_cannot_read_is_refused(
    header: bytes, refused: str
) -> None:
    """http.client decodes ``chunked`` only when it is the whole Transfer-Encoding, and
    drops a Content-Length that is not one number: either way the answer was read as
    whatever came until the connection closed (chunk sizes, compressed bytes, or more
    than the length said) and taken for the text."""
    answer = b"HTTP/1.1 200 OK\r\n" + header + b"\r\n\r\n1f\r\n" + BODY + b"\r\n0\r\n\r\n"
    with pytest.raises(OSError, match=f"127.0.0.1:\\d+/metrics: .*{refused}"):
        fetch(lambda conn: conn.sendall(answer))


def test_a_host_name_that_cannot_be_encoded_is_an_error_naming_the_url() -> None:
    """getaddrinfo's UnicodeError (an empty label) came out bare, naming no URL."""
    with pytest.raises(OSError, match=r"http://a\.\.b:9400/metrics") as caught:
        get_text("http://ops:s3cret@a..b:9400/metrics", 0.5, max_bytes=100)
    assert "s3cret" not in str(caught.value)


@pytest.mark.parametrize("host", ["a b", "h\x7f", "h\x00"], ids=["space", "del", "nul"])
def test_a_host_no_request_can_carry_is_a_value_error_naming_the_url(host: str) -> None:
    """http.client refuses such a host as InvalidURL, neither an OSError nor a
    ValueError (so no caller caught it) and naming only the host."""
    with pytest.raises(ValueError, match="cannot be sent") as caught:
        get_text(f"http://ops:s3cret@{host}:9400/metrics", 0.5, max_bytes=100)
    assert "9400/metrics" in str(caught.value) and "s3cret" not in str(caught.value)


@contextlib.contextmanager
def resolving(
    monkeypatch: pytest.MonkeyPatch, answer: Callable[[], list[tuple[str, int]]]
) -> Iterator[dict[str, int]]:
    """``NAME`` resolves to ``answer()``'s (address, port) pairs; every other name as
    before.  Yields counts of lookups running now and at most at once."""
    real = socket.getaddrinfo
    counts = {"running": 0, "most": 0}
    lock = threading.Lock()

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list:
        if host != NAME:
            return real(host, port, *args, **kwargs)
        with lock:
            counts["running"] += 1
            counts["most"] = max(counts["most"], counts["running"])
        try:
            pairs = answer()
        finally:
            with lock:
                counts["running"] -= 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", pair) for pair in pairs]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield counts


def hang_until(release: threading.Event) -> Callable[[], list[tuple[str, int]]]:
    """A lookup that answers nothing until ``release`` is set (three seconds at most)."""

    def answer() -> list[tuple[str, int]]:
        release.wait(3.0)
        return []

    return answer


def test_a_hung_name_lookup_ends_within_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """getaddrinfo ran before any deadline: a resolver that never answered held the
    caller for as long as the resolver liked."""
    release = threading.Event()
    try:
        with resolving(monkeypatch, hang_until(release)):
            started = time.monotonic()
            with pytest.raises(TimeoutError, match=f"http://{NAME}:9400/metrics"):
                get_text(f"http://{NAME}:9400/metrics", 0.3, max_bytes=100)
            assert time.monotonic() - started < 0.6 + 0.3
    finally:
        release.set()


def test_hung_lookups_one_after_another_hold_a_bounded_number_of_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lookup cannot be interrupted, so each hung one keeps its thread until the
    resolver gives up: repeated GETs of a name whose lookups hang must not each add one."""
    release = threading.Event()
    try:
        with resolving(monkeypatch, hang_until(release)) as counts:
            for _ in range(3 * httpget.MAX_LOOKUPS):
                started = time.monotonic()
                with pytest.raises(TimeoutError, match=NAME):
                    get_text(f"http://{NAME}:9400/metrics", 0.05, max_bytes=100)
                assert time.monotonic() - started < 0.1 + 0.3
            assert counts["most"] <= httpget.MAX_LOOKUPS
    finally:
        release.set()
    # the released lookups end within the next GET's timeout and free their slots
    with resolving(monkeypatch, lambda: []), pytest.raises(OSError, match="no address"):
        get_text(f"http://{NAME}:9400/metrics", 0.5, max_bytes=100)


@contextlib.contextmanager
def blackholes(count: int) -> Iterator[list[tuple[str, int]]]:
    """``count`` loopback addresses (127.0.0.2, ...) whose listener's backlog is full:
    a connection there is never accepted nor refused, it waits until its timeout."""
    sockets: list[socket.socket] = []
    pairs = []
    try:
        for index in range(count):
            listener = socket.socket()
            sockets.append(listener)
            listener.bind((f"127.0.0.{2 + index}", 0))
            listener.listen(0)
            pair = listener.getsockname()
            filler = socket.create_connection(pair, timeout=1.0)  # fills the backlog
            sockets.append(filler)
            pairs.append(pair)
        yield pairs
    finally:
        for each in sockets:
            each.close()


def test_several_dead_addresses_cost_one_bound_not_a_timeout_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """socket.create_connection gives each address the whole timeout: a name with three
    dead addresses before the live one took 3 * timeout to connect, then the answer."""
    endpoint = RawEndpoint(lambda conn: conn.sendall(WHOLE))
    try:
        with blackholes(3) as dead:
            live = [("127.0.0.1", endpoint.port)]
            with resolving(monkeypatch, lambda: dead + live):
                started = time.monotonic()
                with pytest.raises(TimeoutError, match=NAME):
                    get_text(f"http://{NAME}/metrics", 0.4, max_bytes=100)
                assert time.monotonic() - started < 0.8 + 0.3
            with resolving(monkeypatch, lambda: dead[:1] + live):  # time left for the next
                assert get_text(f"http://{NAME}/metrics", 0.4, max_bytes=100) == BODY.decode()
    finally:
        endpoint.close()


def ipv6_loopback() -> socket.socket:
    try:
        if not socket.has_ipv6:
            raise OSError("no IPv6 in this Python")
        socket.if_nametoindex("lo")
        return socket.create_server(("::1", 0), family=socket.AF_INET6)
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback named lo: {exc}")


@pytest.mark.parametrize("zone", ["%25lo", "%lo", "%251"], ids=["encoded", "raw", "index"])
def test_an_ipv6_zone_id_names_the_interface(zone: str) -> None:
    """urlsplit keeps the zone as written ("::1%25lo"), which no lookup resolves; the
    zone is now the interface (by name or number) and the Host header goes without it."""
    listener = ipv6_loopback()
    port = listener.getsockname()[1]
    asked: list[bytes] = []

    def serve() -> None:
        try:
            conn, _ = listener.accept()
        except OSError:  # closed unasked: the GET never came
            return
        with conn:
            asked.append(conn.recv(65536))
            conn.sendall(WHOLE)

    threading.Thread(target=serve, daemon=True).start()
    try:
        assert get_text(f"http://[::1{zone}]:{port}/metrics", 2.0, max_bytes=100) == BODY.decode()
        assert f"\r\nHost: [::1]:{port}\r\n".encode() in asked[0]
    finally:
        listener.close()


def test_an_ipv6_zone_naming_no_interface_is_an_error_naming_the_url() -> None:
    with pytest.raises(OSError, match=r"\[::1%25nosuch9\]:9400.*interface"):
        get_text("http://[::1%25nosuch9]:9400/metrics", 0.5, max_bytes=100)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_an_https_answer_is_read_through_the_handshake_get_text_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """get_text now connects and starts TLS itself (under the watchdog): a server whose
    certificate the default context trusts is read, one it does not trust is refused."""
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj", "/CN=t",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)  # fmt: skip
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        for _ in range(2):
            with contextlib.suppress(OSError):
                conn, _ = listener.accept()
                with server.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(65536)
                    tls.sendall(WHOLE)

    threading.Thread(target=serve, daemon=True).start()
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        with pytest.raises(OSError, match=f"{port}/metrics: .*CERTIFICATE_VERIFY_FAILED"):
            get_text(url, 2.0, max_bytes=100)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read by the default context
        assert get_text(url, 2.0, max_bytes=100) == BODY.decode()
    finally:
        listener.close()
