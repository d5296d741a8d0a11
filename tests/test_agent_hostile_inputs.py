"""The node agent against files and answers a pod controls: ring names and headers, its
metrics endpoint and the exposition it serves.  Each case is a real file or a real
socket; the agent must skip what is bad, keep the node's other pods and say why."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elastico_extender.agent.daemon import Agent, PodInfo
from elastico_extender.agent.framework import read_counter
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings
from elastico_extender.annotations import ProgressEndpoint, parse_progress_metrics
from elastico_extender.profiling.ring import ring_pid
from tests.test_agent_faults import Scripted, item, write_ring


def ring_window(tmp_path: Path, odd_names: list[str]) -> list[dict]:
    """Two windows of two pods whose rings count 100 launches/s; pod ``uid-odd`` also
    holds files named ``odd_names``.  Returns the second window's items."""
    clock = [1_000.0]
    pods = [PodInfo(uid, f"ml/{uid}", None, (), None, None) for uid in ("uid-ok", "uid-odd")]
    for uid in ("uid-ok", "uid-odd"):
        (tmp_path / uid).mkdir()
    agent = Agent("g0", lambda: pods, PodRings(tmp_path), Reporter("http://127.0.0.1:9"),
                  clock=lambda: clock[0], warmup_seconds=0.0)  # fmt: skip
    try:
        for step in range(2):
            flushed = (1_000 + 10 * step) * 10**9
            for uid in ("uid-ok", "uid-odd"):
                write_ring(tmp_path / uid / "elastico-shim-1.ring",
                           launches=1_000 * (step + 1), flushed_ns=flushed)  # fmt: skip
            for name in odd_names:
                write_ring(tmp_path / "uid-odd" / name, launches=7, flushed_ns=flushed)
            items = agent.observe()
            clock[0] += 10.0
    finally:
        agent.reporter.close()
    return items


@pytest.mark.parametrize("name", ["elastico-shim-\u00b2.ring", "elastico-shim-\u0663.ring"])
def test_a_ring_named_with_a_non_ascii_digit_is_no_process_and_costs_no_window(
    tmp_path: Path, name: str
) -> None:
    """``str.isdigit`` is true of '²' and '٣': the first made ``int()`` raise inside the
    agent's window, so one pod's file name cost every pod on the node its window; the
    second was read as pid 3, another process's ring.  Only ASCII digits name a pid."""
    assert ring_pid(name) is None
    items = ring_window(tmp_path, [name])
    assert sorted(i["pod_uid"] for i in items) == ["uid-odd", "uid-ok"]
    assert all(i["rate"] == pytest.approx(100.0) for i in items)


class RawEndpoint:
    """A pod's metrics port speaking whatever bytes ``answer`` writes on each connection
    (after reading the request): a broken or hostile HTTP server, not a mock."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            conn.recv(65536)
            self.answer(conn)

    def close(self) -> None:
        self.listener.close()


def http_answer(head: bytes, body: bytes = b"") -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(head + b"\r\n\r\n" + body)


def trickled_headers(conn: socket.socket) -> None:
    """A status line, then one header byte every 0.2 s for a minute: each read is well
    within the socket timeout, the answer never ends."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    for _ in range(300):
        conn.sendall(b"X")
        time.sleep(0.2)


COUNTER = b"vllm:generation_tokens_total 5\n"
BROKEN_ANSWERS = {
    "a status line that is not HTTP": http_answer(b"HELLO THERE"),
    "a header line over 64 KiB": http_answer(b"HTTP/1.1 200 OK\r\nX: " + b"a" * 70_000),
    "a chunk size that is not hex": http_answer(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked", b"zz\r\n" + COUNTER
    ),
    "a body shorter than its Content-Length": http_answer(
        b"HTTP/1.1 200 OK\r\nContent-Length: 1000", COUNTER
    ),
    "a 404": http_answer(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0"),
}


def read(port: int, path: str = "/metrics", timeout: float = 2.0) -> float | None:
    # Built directly: admission now refuses a path the agent cannot fetch, but a pod
    # admitted by an older extender may still carry one.
    endpoint = ProgressEndpoint(port, path, "vllm:generation_tokens_total", "tokens/s")
    return read_counter(endpoint, "127.0.0.1", timeout=timeout)


@pytest.mark.parametrize("case", sorted(BROKEN_ANSWERS))
def test_a_broken_metrics_answer_is_no_reading_and_a_log_line(case: str, caplog) -> None:
    """http.client raises its own exceptions (BadStatusLine, LineTooLong, IncompleteRead),
    not OSError: one pod's broken endpoint escaped ``read_counter`` and cost every pod on
    the node the window.  A body cut short of its Content-Length was taken as the whole
    exposition (a counter missing from it reads as a reset)."""
    caplog.set_level(logging.INFO, logger="elastico_extender.agent.framework")
    endpoint = RawEndpoint(BROKEN_ANSWERS[case])
    try:
        assert read(endpoint.port) is None
    finally:
        endpoint.close()
    said = [r for r in caplog.records if r.getMessage() == "progress.scrape_failed"]
    assert len(said) == 1 and said[0].url.startswith("http://127.0.0.1:")


def test_a_declared_path_that_is_no_url_path_is_no_reading() -> None:
    """``elastico.io/progress-metrics: 8000/met rics#...`` parsed (admission refuses it
    now, test_annotations); http.client refuses the path with InvalidURL, which is no
    OSError either."""
    endpoint = RawEndpoint(http_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 31", COUNTER))
    try:
        assert read(endpoint.port, "/met rics") is None
        assert read(endpoint.port) == 5.0  # the same endpoint, a plain path: read
    finally:
        endpoint.close()


def test_a_metrics_endpoint_that_trickles_its_headers_is_cut_off_in_time() -> None:
    """A byte of header every 0.2 s keeps each read within a 0.5 s socket timeout: the
    scrape waited out the whole minute (the body's deadline starts after the headers),
    and with it the node's window."""
    endpoint = RawEndpoint(trickled_headers)
    started = time.monotonic()
    try:
        assert read(endpoint.port, timeout=0.5) is None
    finally:
        endpoint.close()
    assert time.monotonic() - started < 3.0


def test_a_redirect_from_a_pods_endpoint_is_not_followed() -> None:
    """The agent reads the port the pod declared on the pod's IP; a 302 elsewhere (another
    service on the node's network) is no reading of this pod's counter."""
    elsewhere = RawEndpoint(http_answer(b"HTTP/1.1 200 OK\r\nContent-Length: 31", COUNTER))
    location = f"http://127.0.0.1:{elsewhere.port}/metrics".encode()
    redirect = RawEndpoint(
        http_answer(b"HTTP/1.1 302 Found\r\nContent-Length: 0\r\nLocation: " + location)
    )
    try:
        assert read(elsewhere.port) == 5.0
        assert read(redirect.port) is None
    finally:
        redirect.close()
        elsewhere.close()


def test_a_broken_metrics_endpoint_costs_only_its_own_pods_window(tmp_path: Path) -> None:
    """One pod's endpoint answers garbage, the other's a counter: the second pod's window
    is reported, the first pod has none (its error stays in the scrape)."""
    good_value = [100]

    def good(conn: socket.socket) -> None:
        body = f"vllm:generation_tokens_total {good_value[0]}\n".encode()
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    endpoints = [RawEndpoint(http_answer(b"HELLO THERE")), RawEndpoint(good)]
    pods = pods_of(endpoints)
    clock = [1_000.0]
    agent = Agent("g0", lambda: pods, PodRings(tmp_path), Reporter("http://127.0.0.1:9"),
                  clock=lambda: clock[0], warmup_seconds=0.0)  # fmt: skip
    try:
        assert agent.observe() == []
        clock[0] += 10.0
        good_value[0] = 600
        items = agent.observe()
    finally:
        agent.reporter.close()
        for e in endpoints:
            e.close()
    assert [(i["pod_uid"], i["rate"]) for i in items] == [("uid-1", 50.0)]


def counter_pods(bodies: list[list[bytes]]) -> tuple[list[PodInfo], list[RawEndpoint]]:
    """One pod per entry of ``bodies``, whose endpoint serves the entry's next body on
    each scrape (the last one for ever)."""

    def serving(queue: list[bytes]) -> Callable[[socket.socket], None]:
        def answer(conn: socket.socket) -> None:
            body = queue.pop(0) if len(queue) > 1 else queue[0]
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

        return answer

    endpoints = [RawEndpoint(serving(list(queue))) for queue in bodies]
    return pods_of(endpoints), endpoints


def pods_of(endpoints: list[RawEndpoint]) -> list[PodInfo]:
    """A pod per endpoint, declaring vLLM's token counter on its port."""
    return [
        PodInfo(f"uid-{n}", f"ml/p{n}", "127.0.0.1", (), None,
                parse_progress_metrics(f"{e.port}#vllm:generation_tokens_total"))
        for n, e in enumerate(endpoints)
    ]  # fmt: skip


@contextlib.contextmanager
def reporting_agent(
    pods: list[PodInfo], server: Scripted, endpoints: list[RawEndpoint]
) -> Iterator[tuple[Agent, Reporter, list[float]]]:
    """A node agent over ``pods`` reporting to ``server``, with the clock it reads
    (``clock[0]``, seconds); the reporter, the server and the endpoints closed after."""
    clock = [1_000.0]
    reporter = Reporter(server.url, clock=lambda: clock[0])
    agent = Agent("g0", lambda: pods, PodRings(None, kubelet_root="/nonexistent"), reporter,
                  clock=lambda: clock[0], warmup_seconds=0.0)  # fmt: skip
    try:
        yield agent, reporter, clock
    finally:
        reporter.close()
        server.stop()
        for e in endpoints:
            e.close()


HUGE = b'vllm:generation_tokens_total{model="a"} 1.7e308\n'


@pytest.mark.parametrize(
    "bodies",
    [
        [HUGE + HUGE.replace(b'"a"', b'"b"')],  # finite samples, an infinite sum
        [b'vllm:generation_tokens_total{model="a"} -1.7e308\n', HUGE],  # a negative one
    ],
    ids=["sum-overflows", "negative-sample"],
)
def test_a_counter_that_is_no_finite_count_costs_neither_the_window_nor_held_ones(
    bodies: list[bytes], caplog
) -> None:
    """Two finite samples of 1.7e308 sum to inf, and inf - inf is NaN; -1.7e308 then
    1.7e308 is a rate of inf.  The reporter's JSON encoder refuses NaN and inf, so the
    POST raised: the node's window went nowhere, and the windows held from an earlier
    refusal were lost with it.  The reading is refused, and logged, instead."""
    caplog.set_level(logging.INFO, logger="elastico_extender.agent.framework")
    pods, endpoints = counter_pods([bodies, [b"vllm:generation_tokens_total 100\n",
                                             b"vllm:generation_tokens_total 600\n"]])  # fmt: skip
    server = Scripted([
        (200, "application/json", b'{"accepted": 0}'),  # the first window: baselines only
        (503, "application/json", b'{"Error": "not the leader"}'),  # another window, held
        (200, "application/json", b'{"accepted": 1}'),  # the held window resent
        (200, "application/json", b'{"accepted": 1}'),  # this window
    ])  # fmt: skip
    with reporting_agent(pods, server, endpoints) as (agent, reporter, clock):
        assert agent.run_once() == {"accepted": 0}
        assert reporter.send("g0", [item("uid-9", 995.0)])["status"] == 503
        clock[0] += 10.0
        result = agent.run_once()
    assert result == {"accepted": 1, "resent": 1}
    posted = [[(o["pod_uid"], o["rate"]) for o in p["observations"]] for p in server.posted]
    assert posted == [[], [("uid-9", 5.0)], [("uid-9", 5.0)], [("uid-1", 50.0)]]
    assert any(r.getMessage() == "progress.counter_invalid" for r in caplog.records)


def test_a_rate_too_large_for_a_float_is_no_window(caplog) -> None:
    """Two valid readings, 0 then 1.7e308, half a second apart (``--once`` may wait that
    little): the rate overflows to inf, which the reporter could not encode.  The pod
    gets no window; the window of the node's other pod goes out."""
    caplog.set_level(logging.INFO, logger="elastico_extender.agent.daemon")
    pods, endpoints = counter_pods([
        [b"vllm:generation_tokens_total 0\n", HUGE],
        [b"vllm:generation_tokens_total 100\n", b"vllm:generation_tokens_total 600\n"],
    ])  # fmt: skip
    server = Scripted([(200, "application/json", b'{"accepted": 0}'),
                       (200, "application/json", b'{"accepted": 1}')])  # fmt: skip
    with reporting_agent(pods, server, endpoints) as (agent, _, clock):
        agent.run_once()
        clock[0] += 0.5
        result = agent.run_once()
    assert result == {"accepted": 1}
    posted = [[(o["pod_uid"], o["rate"]) for o in p["observations"]] for p in server.posted]
    assert posted == [[], [("uid-1", 1000.0)]]
    assert any(r.getMessage() == "window.rate_not_finite" for r in caplog.records)


def test_a_reply_nested_too_deep_neither_raises_nor_loses_held_windows() -> None:
    """A proxy in front of the extender answers 500 with ``[[[[...`` 100,000 deep: json
    raised RecursionError (no ValueError) out of Reporter.send after it had taken the held
    windows out of its queue, so they were gone.  The reply is unreadable, the batch held."""
    server = Scripted([
        (503, "application/json", b'{"Error": "not the leader"}'),
        (500, "application/json", b"[" * 100_000),
    ])  # fmt: skip
    reporter = Reporter(server.url, clock=lambda: 1_000.0)
    try:
        assert reporter.send("g0", [item("a", 990.0)])["status"] == 503
        second = reporter.send("g0", [item("b", 995.0)])
    finally:
        reporter.close()
        server.stop()
    assert second["status"] == 500 and reporter.held == 2


def test_a_ring_that_is_a_link_is_not_followed(tmp_path: Path) -> None:
    """A pod writes only its own volume, but a link there may point anywhere the agent can
    read: ``elastico-shim-1.ring -> <another pod's ring>`` passed that pod's launches off
    as this pod's.  A ring is read only as the regular file it is (O_NOFOLLOW)."""
    other = tmp_path / "uid-b" / "elastico-shim-7.ring"
    other.parent.mkdir()
    write_ring(other, launches=1_000, flushed_ns=1_000 * 10**9)
    (tmp_path / "uid-a").mkdir()
    (tmp_path / "uid-a" / "elastico-shim-1.ring").symlink_to(other)
    rings = PodRings(tmp_path)
    assert rings.sample("uid-b") is not None
    assert rings.sample("uid-a") is None


def test_a_series_listed_twice_is_no_reading(caplog) -> None:
    """``{model="a"} 100`` twice (two registries served together) summed to 200: a count
    the pod never made, and the day one copy goes, a false reset.  Prometheus refuses
    such a scrape; so does the agent, and says so."""
    caplog.set_level(logging.INFO, logger="elastico_extender.agent.framework")
    series = b'vllm:generation_tokens_total{model="a"} 100\n'
    body = series + b'vllm:generation_tokens_total{model="b"} 5\n' + series
    endpoint = RawEndpoint(http_answer(b"HTTP/1.1 200 OK\r\nContent-Length: %d" % len(body), body))
    try:
        assert read(endpoint.port) is None
    finally:
        endpoint.close()
    assert any(r.getMessage() == "progress.counter_invalid" for r in caplog.records)
