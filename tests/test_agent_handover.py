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
from test_service_observations import SOLO, batch, wait_for, window

from elastico_extender.agent.reporter import (
    MAX_AGE_HEADER,
    RETRY_AFTER_CAP_SECONDS,
    STALE_AFTER_SECONDS,
    Reporter,
)
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


@pytest.mark.parametrize(
    ("bound", "age", "taken"),
    [
        (600.0, 200.0, True),  # the agent's own default (110 s) would drop it
        (30.0, 28.5, False),  # the agent's own default would resend it, to be refused
    ],
)
def test_held_windows_live_exactly_as_long_as_the_service_takes_them(
    api: FakeApiServer,  # noqa: F811
    tmp_path: Path,
    bound: float,
    age: float,
    taken: bool,
) -> None:
    """An operator sets ``observation_max_age_seconds``; the replicas state it on every
    answer and the agent holds refused windows for that long (less its margin)."""
    setting = {"observation_max_age_seconds": bound}
    a = Replica.start(api, "replica-a", tmp_path / "a.db", **setting)
    assert wait_for(a.elector.is_leader)
    b = Replica.start(api, "replica-b", tmp_path / "b.db", **setting)
    reporter = Reporter(b.url, token=b.token)  # the Service still routes to b
    try:
        assert wait_for(lambda: len(b.kube.state.pods()) == 3)
        b.epoch()
        beat = reporter.send("g0", [])  # a heartbeat: the follower refuses, stating its bound
        assert beat["status"] == 503
        assert bound - 10.0 <= reporter.max_age_seconds < bound
        time.sleep(max(0.0, reporter.retry_at - time.time()))
        old = window("uid-b", SOLO / 2, end=time.time() - age)
        assert reporter.send("g0", [old])["status"] == 503 and reporter.held == 1
        a.crash()
        assert wait_for(b.elector.is_leader, timeout=TIMING.lease_duration + 5)
        b.epoch()
        if not taken:  # by now the service refuses it as stale
            time.sleep(max(0.0, old["end"] + bound + 0.5 - time.time()))
        time.sleep(max(0.0, reporter.retry_at - time.time()))
        reply = reporter.send("g0", [window("uid-a", SOLO)])
        service = b.app.state.observations  # type: ignore[attr-defined]
        if taken:
            assert reply["accepted"] == 1 and reply["resent"] == 1
            assert reporter.dropped == 0
            assert service.windows_total == {"accepted": 2}
        else:
            assert reply["accepted"] == 1 and "resent" not in reply
            assert reporter.dropped == 1
            assert service.windows_total == {"accepted": 1}  # nothing sent to be refused
            stale = b.post(batch(old))  # what the service says of it
            assert stale.status_code == 422 and "stale" in stale.json()["Error"]
            assert stale.headers[MAX_AGE_HEADER] == f"{bound:g}"
        assert reporter.held == 0
        # the bound is on every answer past authentication: taken, refused as bad input
        taken_now = b.post(batch(window("uid-a", SOLO)))
        assert taken_now.status_code == 200
        malformed = b.post({"node": "g0", "observations": "x"})
        assert malformed.status_code == 400
        for answer in (taken_now, malformed):
            assert answer.headers[MAX_AGE_HEADER] == f"{bound:g}"
    finally:
        reporter.close()
        b.server.stop()
        if a.elector.is_leader():
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


@pytest.mark.parametrize("status", [400, 403, 413])
def test_windows_refused_as_bad_input_are_not_resent(script: Script, status: int) -> None:
    """(A 401 judges the credential, not the windows: they are held, as
    test_observations_agent_identity's rollout test shows.)"""
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


@pytest.mark.parametrize(
    ("stated", "held_for"),
    [
        ("600", 590.0),
        ("30", 27.0),  # a short bound: a tenth of it as the margin
        ("1e+06", 3590.0),  # clamped
        ("0.01", 0.9),  # clamped to 1 s
        (None, 60.0),  # absent (an older extender, a proxy's answer): the default
        ("soon", 60.0),
        ("nan", 60.0),
        ("inf", 60.0),
        ("-30", 60.0),
        ("0", 60.0),
    ],
)
def test_the_stated_bound_is_adopted_clamped_or_ignored(
    script: Script, stated: str | None, held_for: float
) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0], max_age_seconds=60.0)
    first = (200, {MAX_AGE_HEADER: "300"}, {"accepted": 1, "pair_samples": 0})
    refused = (503, {"Retry-After": "1", **({MAX_AGE_HEADER: stated} if stated else {})},
               {"Error": "not the leader", "refused": []})  # fmt: skip
    script.answers[:] = [first, refused, OK, OK]
    reporter.send("g0", [item(1000.0)])
    assert reporter.max_age_seconds == 290.0
    # each answer sets the bound anew: a window held now lives ``held_for`` seconds
    now[0] = 1010.0
    assert reporter.send("g0", [item(1010.0)])["status"] == 503
    assert reporter.max_age_seconds == pytest.approx(held_for)
    now[0] = 1010.0 + held_for + 0.5  # just too old: dropped, not resent
    reporter.send("g0", [item(now[0])])
    assert reporter.dropped == 1 and script.ends()[2:] == [[now[0]]]


def test_a_window_just_inside_the_stated_bound_is_resent(script: Script) -> None:
    now = [1000.0]
    reporter = Reporter(script.url, clock=lambda: now[0])
    assert reporter.max_age_seconds == STALE_AFTER_SECONDS
    script.answers[:] = [(503, {"Retry-After": "1", MAX_AGE_HEADER: "600"}, {"Error": "x"}), OK, OK]
    reporter.send("g0", [item(1000.0)])
    now[0] = 1000.0 + 589.0  # older than the default, younger than the stated 600 - 10
    assert reporter.send("g0", [item(now[0])]) == {**OK[2], "resent": 1}
    assert reporter.dropped == 0 and script.ends() == [[1000.0], [1000.0], [now[0]]]
