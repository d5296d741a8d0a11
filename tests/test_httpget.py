"""``httpget.get_text`` against answers real servers give and lookups that hang: each
server is a real socket on loopback, each lookup the real code path with only
``socket.getaddrinfo`` replaced for one made-up name."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import pytest
from test_agent_hostile_inputs import RawEndpoint

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
