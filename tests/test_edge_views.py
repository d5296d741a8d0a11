"""REST views at the edge (issue 12, item 17): every /jobs row names its pod."""

from __future__ import annotations

import math
import threading
import time

import httpx
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def test_invalid_pods_in_jobs_carry_their_pod_name():
    node = {"kind": "Node", "metadata": {"name": "g0", "labels": {"nvidia.com/gpu.count": "1"}},
            "status": {"allocatable": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    bad = {"kind": "Pod", "metadata": {"name": "typo", "namespace": "ml", "uid": "uid-typo",
           "annotations": {"elastico.io/family": "bert", "elastico.io/wieght": "2"}},
           "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}}  # fmt: skip
    cluster = EmbeddedCluster([node, bad], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server:
        rows = httpx.get(f"{server.url}/jobs").json()
    invalid = [r for r in rows if r["state"] == "invalid"]
    assert len(invalid) == 1
    assert invalid[0]["pod"] == "ml/typo"
    assert "elastico.io/wieght" in invalid[0]["reason"]


FASTEST = "batch_size=128,checkpointing=off,amp=off"


def test_two_pods_sharing_two_gpus_are_one_colocated_pair():
    """/nodes lists each co-located pair of a node once, however many GPUs it shares."""
    gpus = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "2", "pods": "110"}
    node = {"kind": "Node", "metadata": {"name": "g0", "labels": gpus},
            "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip

    def gang(name: str) -> dict:
        notes = {"elastico.io/family": "bert", "elastico.io/assigned-node": "g0",
                 "elastico.io/assigned-devices": "0,1",
                 "elastico.io/assigned-configuration": FASTEST}  # fmt: skip
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                "annotations": notes},
                "spec": {"nodeName": "g0", "containers": [{"name": "c", "resources":
                         {"limits": {"nvidia.com/gpu": "2"}}}]},
                "status": {"phase": "Running"}}  # fmt: skip

    cluster = EmbeddedCluster([node, gang("x"), gang("y")], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server:
        (g0,) = httpx.get(f"{server.url}/nodes").json()
    assert [g["pods"] for g in g0["gpus"]] == [["ml/x", "ml/y"], ["ml/x", "ml/y"]]
    assert g0["colocated_pairs"] == [["ml/x", "ml/y"]]


def test_a_queued_pod_in_jobs_says_why_it_waits():
    """`kubectl elastico why POD` reads /jobs: a pod the plan keeps queued carried no
    reason (null), so the command could only say 'queued'."""
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "1", "pods": "110"}
    node = {"kind": "Node", "metadata": {"name": "g0", "labels": {
            "nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "40960",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
            "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip

    def pod(name: str, bound: bool) -> dict:
        notes = {"elastico.io/family": "mistral-7b"}  # 28 GiB at its leanest: never two
        spec: dict = {"schedulerName": "elastico-scheduler", "containers": [{"name": "c",
                      "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}  # fmt: skip
        if bound:
            notes |= {"elastico.io/assigned-node": "g0", "elastico.io/assigned-devices": "0"}
            spec["nodeName"] = "g0"
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                "annotations": notes}, "spec": spec,
                "status": {"phase": "Running" if bound else "Pending"}}  # fmt: skip

    cluster = EmbeddedCluster([node, pod("first", True), pod("second", False)], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    with ServerThread(app) as server:
        rows = {r["pod"]: r for r in httpx.get(f"{server.url}/jobs").json()}
    assert rows["ml/second"]["state"] == "queued"
    assert "no GPU has room" in rows["ml/second"]["reason"]


def test_kept_views_follow_bookings_the_cluster_and_new_plans():
    """/jobs, /nodes and /plan are served from kept bytes while nothing changed, and a
    booking, a booking dropped by the epoch (which does not move the bookings' version),
    an invalid pod deleted and a new plan each show at once: every reply equals a fresh
    build of the view."""
    gpus = {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "2", "pods": "110"}
    node = {"kind": "Node", "metadata": {"name": "g0", "labels": gpus},
            "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip

    def pod(name: str, notes: dict[str, str]) -> dict:
        return {"kind": "Pod", "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                "annotations": {"elastico.io/family": "bert", **notes}},
                "spec": {"schedulerName": "elastico-scheduler", "containers": [{"name": "c",
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Pending"}}  # fmt: skip

    bad = pod("typo", {"elastico.io/wieght": "2"})
    cluster = EmbeddedCluster([node, pod("waiting", {}), bad], "test")
    app = create_app(ServiceSettings(epoch_seconds=600), cluster)
    engine = app.state.engine

    def served(view: str) -> object:
        reply = httpx.get(f"{server.url}/{view}")
        assert reply.status_code == 200, reply.text
        return reply.json()

    def fresh() -> dict[str, object]:
        return {"jobs": engine.jobs(), "nodes": engine.nodes(), "plan": engine.plan_summary()}

    def state(rows: object, uid: str) -> str:
        assert isinstance(rows, list)
        return next(r["state"] for r in rows if r["id"] == uid)

    with ServerThread(app) as server:
        assert engine.view_json("nodes") is engine.view_json("nodes")  # kept, not rebuilt
        before = {view: served(view) for view in ("jobs", "nodes", "plan")}
        assert before == fresh()
        assert state(before["jobs"], "uid-waiting") != "binding"

        assert engine.bind("ml", "waiting", "uid-waiting", "g0") == ""
        booked = {view: served(view) for view in ("jobs", "nodes", "plan")}
        assert booked == fresh()
        assert state(booked["jobs"], "uid-waiting") == "binding"
        (g0,) = booked["nodes"]  # type: ignore[misc]
        assert ["ml/waiting"] in [g["pods"] for g in g0["gpus"]]

        version = engine.bookings.version
        engine.bookings.settle(set(), math.inf)  # expired: dropped, the version unmoved
        assert engine.bookings.version == version and len(engine.bookings) == 0
        assert state(served("jobs"), "uid-waiting") != "binding"
        assert served("nodes") == engine.nodes()

        invalid = [r for r in served("jobs") if r["state"] == "invalid"]  # type: ignore[attr-defined]
        assert [r["pod"] for r in invalid] == ["ml/typo"]
        cluster.state.apply("pods", "DELETED", bad)
        invalid = [r for r in served("jobs") if r["state"] == "invalid"]  # type: ignore[attr-defined]
        assert [r["pod"] for r in invalid] == [None]

        epoch = served("plan")["epoch"]  # type: ignore[index]
        engine.run_epoch()
        after = {view: served(view) for view in ("jobs", "nodes", "plan")}
        assert after == fresh()
        assert after["plan"]["epoch"] == epoch + 1  # type: ignore[index]
        assert not [r for r in after["jobs"] if r["state"] == "invalid"]  # type: ignore[attr-defined]


def held_read_leaves_healthz_answered(
    server: ServerThread, path: str, held: threading.Event
) -> httpx.Response:
    """GET ``path`` in a thread while whatever it renders waits on ``held``; /healthz must
    be answered meanwhile (within 2 s: the render holds up to 5).  Returns the reply to
    ``path``, once ``held`` is set after /healthz."""
    reply: list[httpx.Response] = []
    reader = threading.Thread(target=lambda: reply.append(httpx.get(server.url + path, timeout=30)))
    reader.start()
    time.sleep(0.3)  # the read is rendering
    started = time.monotonic()
    health = httpx.get(f"{server.url}/healthz", timeout=30)
    waited = time.monotonic() - started
    held.set()
    reader.join(30)
    assert health.status_code == 200
    assert waited < 2.0, f"/healthz waited {waited:.1f} s behind GET {path}"
    return reply[0]


def test_a_slow_metrics_scrape_does_not_hold_up_the_scheduler() -> None:
    """A /metrics scrape renders every series (about 0.4 s at 10,000 observed pods); on
    the event loop that kube-scheduler's verbs share, each scrape stalled scheduling that
    long.  Its collectors read under their own locks, so it renders in a worker thread:
    here a collector that holds the scrape until /healthz has been answered."""
    answered = threading.Event()

    class HeldScrape(Collector):
        def collect(self):  # type: ignore[no-untyped-def]
            answered.wait(5)
            yield GaugeMetricFamily("test_held_scrape", "held until /healthz answered", 1.0)

    app = create_app(ServiceSettings(epoch_seconds=600), EmbeddedCluster([], "test"))
    app.state.metrics.registry.register(HeldScrape())
    with ServerThread(app) as server:
        scrape = held_read_leaves_healthz_answered(server, "/metrics", answered)
    assert scrape.status_code == 200 and "test_held_scrape 1.0" in scrape.text


def test_building_get_observations_does_not_hold_up_the_scheduler() -> None:
    """GET /observations builds a row per observed pod and pair (about 0.2 s at 10,000
    pods) from a copy taken under the service's lock; built on the event loop it stalled
    every verb that long.  It is built in a worker thread: here its clock holds the build
    until /healthz has been answered."""
    app = create_app(ServiceSettings(epoch_seconds=600), EmbeddedCluster([], "test"))
    service = app.state.observations
    answered = threading.Event()
    clock = service.clock

    def held_clock() -> float:
        if threading.current_thread() is not threading.main_thread():
            answered.wait(5)
        return clock()

    with ServerThread(app) as server:
        service.clock = held_clock
        view = held_read_leaves_healthz_answered(server, "/observations", answered)
    assert view.status_code == 200 and view.json()["pods"] == []
