"""The agent keeps windows a follower refused during a leader hand-over (503 +
Retry-After) and resends them, oldest first, once a leader takes them; windows the
server took or refused as bad input are not resent, stale ones and overflow are dropped.

First against two real extender replicas (uvicorn on 127.0.0.1, the real kubernetes
client, the project's fake API server) whose leader dies; then against a plain HTTP
server on 127.0.0.1 that answers what each case needs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from test_learned_checkpoint import TIMING, Replica, api  # noqa: F401
from test_service_observations import SOLO, wait_for, window

from elastico_extender.agent.reporter import RETRY_AFTER_CAP_SECONDS, Reporter
from elastico_extender.cluster.fake_apiserver import FakeApiServer


def test_windows_a_follower_refused_reach_the_next_leader(
    api: FakeApiServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    a = Replica.start(api, "replica-a", tmp_path / "a.db")
    assert wait_for(a.elector.is_leader)
    b = Replica.start(api, "replica-b", tmp_path / "b.db")
    reporter = Reporter(b.url, token=b.token)  # the Service still routes to b
    try:
        assert wait_for(lambda: len(b.kube.state.pods()) == 3)
        b.epoch()
        first = reporter.send("g0", [window("uid-a", SOLO), window("uid-b", SOLO / 2)])
        assert first["status"] == 503 and reporter.held == 2
        a.crash()
        assert wait_for(b.elector.is_leader, timeout=TIMING.lease_duration + 5)
        b.epoch()
        time.sleep(max(0.0, reporter.retry_at - time.time()))
        reply = reporter.send("g0", [window("uid-a", SOLO), window("uid-b", SOLO / 2)])
        assert reply == {"accepted": 2, "pair_samples": 2, "resent": 2}
        assert reporter.held == 0 and reporter.dropped == 0
        view = b.app.state.observations.view()  # type: ignore[attr-defined]
        pair = next(p for p in view["pairs"] if p["victim"] == "ml/b")
        assert pair["windows"] == 2  # the held window and the new one, both learned
    finally:
        reporter.close()
        b.server.stop()
        if a.elector.is_leader():  # not crashed: the test failed before the hand-over
            a.server.stop()


class Script:
    """A real HTTP server on 127.0.0.1 answering POST /observations from a script of
    (status, headers, body) and recording every request body."""

    def __init__(self, answers: list[tuple[int, dict[str, str], dict]]) -> None:
        self.answers = answers
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(json.loads(self.rfile.read(length)))
                status, headers, body = (
                    outer.answers.pop(0) if outer.answers else (200, {}, {"accepted": -1})
                )
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def ends(self) -> list[list[float]]:
        return [[item["end"] for item in body["observations"]] for body in self.bodies]


@pytest.fixture
def script() -> Iterator[Script]:
    server = Script([])
    yield server
    server.httpd.shutdown()
    server.httpd.server_close()


FOLLOWER = (503, {"Retry-After": "1"}, {"Error": "not the leader", "refused": []})
OK = (200, {}, {"accepted": 1, "pair_samples": 0})


def item(end: float) -> dict:
    return {"pod_uid": "uid-a", "end": end, "seconds": 5.0, "rate": 1.0, "unit": "x/s"}


def test_retry_after_is_honoured_then_held_windows_go_first(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0])
    script.answers[:] = [FOLLOWER, OK, OK, OK]
    assert reporter.send("g0", [item(1000.0)])["status"] == 503
    now[0] += 0.5  # inside Retry-After: nothing is posted, the window waits with the first
    deferred = reporter.send("g0", [item(1000.5)])
    assert deferred["deferred"] and reporter.held == 2 and len(script.bodies) == 1
    now[0] += 1.0
    assert reporter.send("g0", [item(1001.5)]) == {**OK[2], "resent": 2}
    # oldest first, one pod's windows in separate batches (a batch names a pod once)
    assert script.ends() == [[1000.0], [1000.0], [1000.5], [1001.5]]
    assert reporter.held == 0


def test_retry_after_is_capped(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0])
    script.answers[:] = [(503, {"Retry-After": "86400"}, {"Error": "not the leader"})]
    reporter.send("g0", [item(1000.0)])
    assert reporter.retry_at == 1000.0 + RETRY_AFTER_CAP_SECONDS


@pytest.mark.parametrize("status", [400, 401, 403, 413])
def test_windows_refused_as_bad_input_are_not_resent(script: Script, status: int) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0])
    script.answers[:] = [(status, {}, {"Error": "bad"}), OK]
    assert reporter.send("g0", [item(1000.0)])["status"] == status
    assert reporter.held == 0
    now[0] += 5
    reporter.send("g0", [item(1005.0)])
    assert script.ends() == [[1000.0], [1005.0]]


def test_accepted_windows_are_not_resent_and_409_is_retried(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0])
    script.answers[:] = [OK, (409, {}, {"Error": "no plan published yet"}), OK]
    reporter.send("g0", [item(1000.0)])
    now[0] += 5
    reporter.send("g0", [item(1005.0)])
    now[0] += 5
    reporter.send("g0", [item(1010.0)])
    assert script.ends() == [[1000.0], [1005.0], [1005.0], [1010.0]]


def test_stale_windows_are_dropped_not_resent(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0], max_age_seconds=60.0)
    script.answers[:] = [FOLLOWER, OK]
    reporter.send("g0", [item(1000.0)])
    now[0] += 61.0  # the service would refuse it as stale
    assert reporter.send("g0", [item(1061.0)]) == OK[2]
    assert script.ends() == [[1000.0], [1061.0]]
    assert reporter.dropped == 1


def test_the_queue_is_capped_oldest_first(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0], max_held=3)
    script.answers[:] = [FOLLOWER]
    reporter.send("g0", [item(1000.0), {**item(1000.0), "pod_uid": "uid-b"}])
    for k in (1, 2):  # deferred by Retry-After: held, not posted
        now[0] += 0.1
        reporter.send("g0", [item(1000.0 + k)])
    assert reporter.held == 3 and reporter.dropped == 1
    now[0] += 2.0
    reporter.send("g0", [])
    # uid-a's first window went; uid-b's and the two later ones were resent, in order
    assert [[i["pod_uid"] for i in b["observations"]] for b in script.bodies[1:]] == [
        ["uid-b"],
        ["uid-a"],
        ["uid-a"],
    ]
