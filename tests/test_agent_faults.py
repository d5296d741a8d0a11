"""The node agent against what a pod or the network can do to it: a metrics endpoint that
never ends its answer, rings that shrink under the reader, replies that are not JSON."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from kubernetes import client as kube

from elastico_extender.agent import cli as agent_cli
from elastico_extender.agent import rings as agent_rings
from elastico_extender.agent.cli import kube_pods
from elastico_extender.agent.daemon import Agent, PodInfo
from elastico_extender.agent.framework import MAX_SCRAPE_BYTES, read_counter
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodRings, kubelet_ring_directory
from elastico_extender.annotations import parse_progress_metrics
from elastico_extender.profiling.layout import (
    HEADER_DTYPE,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    RECORD_SIZE,
)

ROOT = Path(__file__).resolve().parents[1]


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


def write_ring(
    path: Path,
    *,
    launches: int,
    flushed_ns: int,
    capacity: int = 16,
    monotonic_ns: int = 0,
    started_ns: int = 0,
    started_monotonic_ns: int = 0,
    flush_interval_ns: int = 0,
) -> None:
    """A ring file as the shim lays it out (layout.py's dtypes, checked against the built
    library's own description in test_shim_layout): a header and ``capacity`` slots.
    ``monotonic_ns`` 0 is a shim from before the monotonic stamps (those bytes were zero).
    The process started at ``started_ns`` (and ``started_monotonic_ns``); 0: at time 0,
    so that every write of one file is of one process unless a test says otherwise.
    ``flush_interval_ns`` 0: a header that does not state its flush interval."""
    head = np.zeros(1, dtype=HEADER_DTYPE)
    head["magic"], head["version"] = MAGIC, LAYOUT_VERSION
    head["record_size"], head["header_size"], head["capacity"] = RECORD_SIZE, HEADER_SIZE, capacity
    head["start_realtime_ns"] = started_ns
    head["launches"], head["last_flush_realtime_ns"] = launches, flushed_ns
    head["flush_interval_ns"] = flush_interval_ns
    if monotonic_ns:
        head["start_monotonic_ns"] = started_monotonic_ns
        head["last_flush_monotonic_ns"] = monotonic_ns
    path.write_bytes(head.tobytes() + bytes(capacity * RECORD_SIZE))


def test_a_ring_truncated_under_the_agent_is_skipped_not_a_sigbus(tmp_path: Path) -> None:
    """A container restart starts a process with the same pid in the same volume, and the
    shim opens ``elastico-shim-<pid>.ring`` with O_TRUNC before it reserves the pages
    again (a pod can also truncate its own ring at will).  An agent reading through a
    mapping of that file touches pages past its end: SIGBUS, the whole node's agent
    gone.  The truncated ring must be skipped, and read again once it is whole."""
    ring = tmp_path / "uid-a" / "elastico-shim-1.ring"
    ring.parent.mkdir()
    write_ring(ring, launches=100, flushed_ns=1_000 * 10**9)
    code = f"""
import os
from elastico_extender.agent.rings import PodRings
rings = PodRings({str(tmp_path)!r})
assert rings.sample("uid-a").processes == 1
os.truncate({str(ring)!r}, 0)  # the restarted process's open(O_TRUNC)
print("truncated:", rings.sample("uid-a"))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"agent died with status {proc.returncode}: {proc.stderr}"
    assert "truncated: None" in proc.stdout
    # and in this process: skipped while truncated, followed again once whole
    write_ring(ring, launches=100, flushed_ns=1_000 * 10**9)
    rings = PodRings(tmp_path)
    assert rings.sample("uid-a") is not None
    os.truncate(ring, 0)
    assert rings.sample("uid-a") is None
    write_ring(ring, launches=5, flushed_ns=1_002 * 10**9)
    again = rings.sample("uid-a")
    assert again is not None and again.processes == 1
    rings.close()


def test_a_wall_clock_step_between_flushes_does_not_change_the_rate(tmp_path: Path) -> None:
    """The wall clock stepped forward an hour between two flushes (NTP, a resumed VM):
    10 s of real time passed and 1,000 launches, so 100 launches/s, not 1000/3610 (a
    fake 28x slowdown fed to the closed loop); stepped back, still 100/s, not no rate.
    A ring of an older shim (no monotonic stamps) keeps the wall-clock span."""
    ring = tmp_path / "uid-a" / "elastico-shim-1.ring"
    ring.parent.mkdir()
    for step_s in (3600, -3600):
        rings = PodRings(tmp_path)
        write_ring(ring, launches=1_000, flushed_ns=10_000 * 10**9, monotonic_ns=50 * 10**9)
        rings.sample("uid-a")
        write_ring(ring, launches=2_000, flushed_ns=(10_010 + step_s) * 10**9,
                   monotonic_ns=60 * 10**9)  # fmt: skip
        got = rings.sample("uid-a")
        assert got is not None and got.rate == pytest.approx(100.0), step_s
    rings = PodRings(tmp_path)
    write_ring(ring, launches=1_000, flushed_ns=10_000 * 10**9)
    rings.sample("uid-a")
    write_ring(ring, launches=2_000, flushed_ns=10_020 * 10**9)
    got = rings.sample("uid-a")
    assert got is not None and got.rate == pytest.approx(50.0)


def test_a_later_process_with_the_same_pid_is_not_diffed_against_the_earlier_one(
    tmp_path: Path,
) -> None:
    """A container restarted in its pod gets the same pid, and its volume keeps the ring's
    name: the new process starts the ring afresh.  Once it has launched more than the old
    one had, the counter no longer goes back; before, the agent then took the difference
    of two processes' counters (1,500 - 1,000 over 5 s: 100/s, a 3.3x slowdown fed to the
    closed loop).  The start time tells them apart: 1,500 since it started 4.5 s ago."""
    ring = tmp_path / "uid-a" / "elastico-shim-1.ring"
    ring.parent.mkdir()
    rings = PodRings(tmp_path)
    write_ring(ring, launches=1_000, flushed_ns=10_000 * 10**9, monotonic_ns=50 * 10**9,
               started_ns=9_000 * 10**9, started_monotonic_ns=40 * 10**9)  # fmt: skip
    rings.sample("uid-a")
    write_ring(ring, launches=1_500, flushed_ns=10_005 * 10**9, monotonic_ns=55 * 10**9,
               started_ns=10_000_500_000_000, started_monotonic_ns=50_500_000_000)  # fmt: skip
    got = rings.sample("uid-a")
    assert got is not None and got.rate == pytest.approx(1_500 / 4.5)


def test_the_agent_forgets_pods_that_left_the_node(tmp_path: Path) -> None:
    """emptyDir mode: the kubelet removes a departed pod's rings, and the agent never looks
    for that uid again; what it kept about the pod (per-process baselines, last scan)
    must go with it, or a node's churn of short pods grows the agent without bound."""
    kubelet = tmp_path / "kubelet"
    clock = [1_000.0]
    listed: list[PodInfo] = []
    rings = PodRings(None, kubelet_root=kubelet)
    agent = Agent("g0", lambda: listed, rings, Reporter("http://127.0.0.1:9"),
                  clock=lambda: clock[0])  # fmt: skip
    for n in range(50):
        uid = f"uid-{n}"
        ring = kubelet_ring_directory(kubelet, uid) / "elastico-shim-1.ring"
        ring.parent.mkdir(parents=True)
        flushed = int(clock[0] * 1e9)
        listed[:] = [PodInfo(uid, f"ml/p{n}", None, (), None, None)]
        write_ring(ring, launches=10, flushed_ns=flushed)
        agent.observe()
        write_ring(ring, launches=60, flushed_ns=flushed + 10**10)
        clock[0] += 10.0
        assert [i["pod_uid"] for i in agent.observe()] == [uid]
        shutil.rmtree(kubelet / "pods" / uid)  # the pod is deleted: the kubelet cleans up
        listed.clear()
        agent.observe()
    assert rings._last == {} and rings._scanned == {}
    assert agent._ends == {}


class Scripted:
    """An HTTP server answering ``POST /observations`` with the next scripted
    ``(status, content type, body[, headers])`` (the extender, or a proxy in front)."""

    def __init__(self, answers: list[tuple]) -> None:
        self.answers = list(answers)
        self.posted: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.posted.append(json.loads(body))
                status, kind, reply, *extra = outer.answers.pop(0)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                for name, value in (extra[0] if extra else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def item(uid: str, end: float) -> dict:
    return {"pod_uid": uid, "end": end, "seconds": 10.0, "rate": 5.0, "unit": "launches/s"}


def test_replies_that_are_not_a_json_object_neither_raise_nor_lose_held_windows() -> None:
    """A 200 from a proxy's HTML page, a 500 whose body is a JSON string: the reporter
    says what came back and goes on; a held window is still resent, never dropped by an
    exception halfway through the batches."""
    html = b"<html><body>upstream connect error</body></html>"
    server = Scripted([
        (503, "application/json", b'{"Error": "not the leader"}'),  # window 1 held
        (500, "application/json", b'"boom"'),  # held window 1 again, and window 2
        (200, "text/html", html),  # window 1 resent: a proxy's page, not the extender's
        (200, "application/json", b'{"accepted": 1}'),  # window 2 resent
        (200, "application/json", b"[1, 2]"),  # window 3
    ])  # fmt: skip
    reporter = Reporter(server.url, clock=lambda: 1_000.0)
    try:
        first = reporter.send("g0", [item("a", 990.0)])
        assert first["status"] == 503 and reporter.held == 1
        second = reporter.send("g0", [item("b", 995.0)])
        assert second["status"] == 500 and reporter.held == 2
        third = reporter.send("g0", [item("c", 999.0)])
        assert reporter.held == 0
        assert third["status"] == 200 and "not a JSON object" in third["error"]
        assert "resent" in third
    finally:
        reporter.close()
        server.stop()
    assert [[o["pod_uid"] for o in p["observations"]] for p in server.posted] == [
        ["a"], ["a"], ["a"], ["b"], ["c"],
    ]  # fmt: skip


def test_a_clock_stepped_back_does_not_stretch_a_retry_after() -> None:
    """``Retry-After: 5`` is five seconds, whatever the wall clock does meanwhile: after
    the agent's clock is stepped back an hour (NTP, a VM resumed), the next report is
    posted, not held for the hour."""
    taken = (200, "application/json", b'{"accepted": 1}')
    server = Scripted([
        (503, "application/json", b'{"Error": "not the leader"}', {"Retry-After": "5"}),
        taken, taken, taken,
    ])  # fmt: skip
    now = [10_000.0]
    reporter = Reporter(server.url, clock=lambda: now[0])
    try:
        first = reporter.send("g0", [item("a", 9_995.0)])
        assert first["status"] == 503
        now[0] = 10_001.0
        assert reporter.send("g0", [item("b", 9_999.0)])["deferred"]  # within Retry-After
        now[0] = 10_001.0 - 3_600.0  # the clock is stepped back an hour
        result = reporter.send("g0", [item("c", now[0] - 5.0)])
    finally:
        reporter.close()
        server.stop()
    assert "deferred" not in result and result.get("accepted") == 1
    assert [[o["pod_uid"] for o in p["observations"]] for p in server.posted] == [
        ["a"], ["a"], ["b"], ["c"],
    ]  # fmt: skip


def test_an_api_server_out_of_reach_still_lets_held_windows_go_out(caplog) -> None:
    """The pod listing fails (no answer from the API server): the window has no pods, the
    log says why in one line, and the report still goes out, so windows held from
    before are resent while the extender can take them rather than left to expire."""
    core = kube.CoreV1Api(kube.ApiClient(kube.Configuration(host="http://127.0.0.1:9")))
    server = Scripted([
        (503, "application/json", b'{"Error": "not the leader"}'),
        (200, "application/json", b'{"accepted": 1}'),
    ])  # fmt: skip
    now = [1_000.0]
    reporter = Reporter(server.url, clock=lambda: now[0])
    reporter.send("g0", [item("a", 995.0)])
    assert reporter.held == 1
    agent = Agent("g0", lambda: kube_pods(core, "g0"), PodRings(None), reporter,
                  clock=lambda: now[0])  # fmt: skip
    now[0] = 1_010.0
    try:
        result = agent.run_once()
    finally:
        reporter.close()
        server.stop()
    assert result.get("accepted") == 1 and reporter.held == 0
    assert [[o["pod_uid"] for o in p["observations"]] for p in server.posted] == [["a"], ["a"]]
    failed = [r for r in caplog.records if r.getMessage() == "pods.list_failed"]
    assert failed and "127.0.0.1" in failed[0].error and not failed[0].exc_info


def test_a_ring_of_another_layout_is_named_in_the_log_once(tmp_path: Path, caplog) -> None:
    """A pod whose shim writes another layout version (an image built with an older or
    newer ElastiCo) gets no launch rate: the agent says which ring and why, once, not
    every window; a ring still being created (short for a moment) is not reported."""
    directory = tmp_path / "uid-a"
    directory.mkdir()
    old = directory / "elastico-shim-7.ring"
    write_ring(old, launches=10, flushed_ns=10**12)
    data = bytearray(old.read_bytes())
    data[4:6] = (LAYOUT_VERSION + 1).to_bytes(2, "little")  # the header's version field
    old.write_bytes(bytes(data))
    new = directory / "elastico-shim-8.ring"
    new.write_bytes(b"")  # just opened by its shim, not yet reserved
    caplog.set_level(logging.INFO, logger="elastico_extender.agent.rings")
    rings = PodRings(tmp_path)
    assert rings.sample("uid-a") is None
    write_ring(new, launches=0, flushed_ns=10**12)  # whole by the next window
    for _ in range(3):
        window = rings.sample("uid-a")
        assert window is not None and window.processes == 1
    warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1
    assert warned[0].getMessage() == "ring.unusable" and warned[0].path == str(old)
    assert f"layout version {LAYOUT_VERSION + 1}" in warned[0].error


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose connections are accepted (the kernel's backlog) and never answered:
    an API server that hangs, or a load balancer in front of a dead one."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield sock.getsockname()[1]
    sock.close()


def test_an_api_server_that_never_answers_does_not_stall_the_agent(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's window is bounded even when the pod listing gets no reply: the agent
    gives up on it and reports, instead of waiting for ever on one request."""
    monkeypatch.setattr(agent_cli, "LIST_TIMEOUT_SECONDS", 0.3)
    core = kube.CoreV1Api(
        kube.ApiClient(kube.Configuration(host=f"http://127.0.0.1:{silent_port}"))
    )
    server = Scripted([(200, "application/json", b'{"accepted": 0}')])
    reporter = Reporter(server.url)
    agent = Agent("g0", lambda: kube_pods(core, "g0"), PodRings(None), reporter)
    got: list[dict] = []
    thread = threading.Thread(target=lambda: got.append(agent.run_once()), daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout=15)
    reporter.close()
    server.stop()
    assert not thread.is_alive(), "the agent's window was still waiting for the API server"
    assert got == [{"accepted": 0}] and time.monotonic() - started < 15


def test_a_ring_directory_full_of_files_costs_a_bounded_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod owns its ring directory and can fill it with any number of files: the agent
    looks at a bounded number of entries per directory each window (here 50), not at a
    listing that grows with whatever the pod created."""
    monkeypatch.setattr(agent_rings, "MAX_DIRECTORY_ENTRIES", 50)
    directory = tmp_path / "uid-a"
    (directory / "trainer").mkdir(parents=True)
    for pid in range(400):
        (directory / f"elastico-shim-{pid}.ring").touch()
        (directory / "trainer" / f"elastico-shim-{pid}.ring").touch()
    found = agent_rings.pod_rings(directory)
    assert 0 < len(found) <= 2 * 50
    assert {container for container, _ in found} <= {"", "trainer"}


def test_a_windows_metrics_endpoints_are_read_at_once_not_one_after_another(
    tmp_path: Path,
) -> None:
    """Four pods' metrics ports that answer only once all four have been asked: read one
    after another, each would wait out its scrape's time limit (a node of hanging
    endpoints then spent that limit once per pod every window); read at once, all four
    answer, and every pod gets its rate."""
    barrier = threading.Barrier(4, timeout=3.0)
    served = [0]

    class AllAtOnce(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                barrier.wait()
            except threading.BrokenBarrierError:
                self.send_error(503)
                return
            served[0] += 1
            body = f"vllm:generation_tokens_total {100 * served[0]}\n".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), AllAtOnce) for _ in range(4)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        pods = [
            PodInfo(f"uid-{i}", f"ml/p{i}", "127.0.0.1", (), None,
                    parse_progress_metrics(f"{s.server_address[1]}#vllm:generation_tokens_total"))
            for i, s in enumerate(servers)
        ]  # fmt: skip
        now = [1000.0]
        agent = Agent("n1", lambda: pods, PodRings(str(tmp_path)), Reporter("http://127.0.0.1:9"),
                      clock=lambda: now[0], warmup_seconds=0.0)  # fmt: skip
        try:
            assert agent.observe() == []  # the first reading of each counter is its baseline
            now[0] += 10.0
            items = agent.observe()
        finally:
            agent.reporter.close()
        assert sorted(item["pod_uid"] for item in items) == [f"uid-{i}" for i in range(4)]
        assert all(item["unit"] == "tokens/s" and item["rate"] > 0 for item in items)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
