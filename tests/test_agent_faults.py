"""The node agent against what a pod or the network can do to it: a metrics endpoint that
never ends its answer, rings that shrink under the reader, replies that are not JSON."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from elastico_extender.agent.framework import MAX_SCRAPE_BYTES, read_counter
from elastico_extender.annotations import parse_progress_metrics


class Misbehaving:
    """A pod's metrics port that answers 200 and then never finishes: ``/endless``
    streams chunks with no end, ``/trickle`` sends one byte every 0.2 s."""

    def __init__(self) -> None:
        self.closing = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                piece, pause = (b"x" * 65536, 0.005) if self.path == "/endless" else (b"#", 0.2)
                try:
                    while not outer.closing.is_set():
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                        self.wfile.flush()
                        time.sleep(pause)
                except OSError:
                    return  # the agent hung up: what it should do

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def misbehaving() -> Iterator[Misbehaving]:
    m = Misbehaving()
    yield m
    m.stop()


def scrape_in_thread(port: int, path: str, timeout: float) -> tuple[list[object], threading.Thread]:
    endpoint = parse_progress_metrics(f"{port}{path}#vllm:generation_tokens_total")
    got: list[object] = []
    thread = threading.Thread(
        target=lambda: got.append(read_counter(endpoint, "127.0.0.1", timeout=timeout)),
        daemon=True,
    )
    thread.start()
    return got, thread


@pytest.mark.parametrize("path", ["/endless", "/trickle"])
def test_a_metrics_endpoint_that_never_ends_costs_one_bounded_scrape(
    misbehaving: Misbehaving, path: str
) -> None:
    """The pod owns its metrics port: an answer with no end (or one byte at a time, each
    within the socket timeout) must neither hold the node's window for ever nor be
    buffered whole; the scrape gives up after its limit of bytes or of time."""
    started = time.monotonic()
    got, thread = scrape_in_thread(misbehaving.port, path, timeout=0.5)
    thread.join(timeout=8.0)
    assert not thread.is_alive(), f"the scrape of {path} was still reading after 8 s"
    assert got == [None]
    assert time.monotonic() - started < 8.0
    assert MAX_SCRAPE_BYTES <= 8 << 20
