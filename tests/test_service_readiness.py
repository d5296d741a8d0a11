"""Readiness means "synced and planned on the synced view", and a node added to the
cluster reaches per-pod answers at once (issue 12 item 2)."""

from __future__ import annotations

import time

from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


class SyncingCluster(EmbeddedCluster):
    """A cluster view that starts empty and unsynced, as an informer's does."""

    def __init__(self, objects: list[dict]) -> None:
        super().__init__([], "syncing")
        self.objects = objects
        self.state.synced = {"nodes": False, "pods": False}

    def sync(self) -> None:
        nodes = [o for o in self.objects if o["kind"] == "Node"]
        pods = [o for o in self.objects if o["kind"] == "Pod"]
        self.state.replace("nodes", nodes, "7")
        self.state.replace("pods", pods, "7")


def test_not_ready_until_planned_on_the_synced_view():
    cluster = SyncingCluster([gpu_node("g0")])
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.start()
    try:
        assert not engine.ready  # planned on an empty, unsynced view
        cluster.sync()
        ready_now = engine.ready
        assert engine.filter(elastic_pod("p"), ["g0"]).passed == ["g0"]  # no stale answer
        assert not ready_now or engine.published.view.node_index.get("g0") is not None
        deadline = time.monotonic() + 5
        while not engine.ready and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.ready
        assert engine.published.synced
    finally:
        engine.stop()


def test_a_node_added_is_answered_at_once_not_at_the_next_epoch():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    cluster.state.apply("nodes", "ADDED", gpu_node("g1"))
    outcome = engine.filter(elastic_pod("p"), ["g0", "g1"])
    assert outcome.passed == ["g0", "g1"]
    assert engine.prioritize(elastic_pod("p"), ["g1"]).pairs()[0][1] > 0


def test_the_loop_replans_soon_after_a_node_is_added():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.start()
    try:
        first = engine.published.plan.epoch
        cluster.state.apply("nodes", "ADDED", gpu_node("g1"))
        deadline = time.monotonic() + 5
        while engine.published.plan.epoch == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "g1" in engine.published.view.node_index
        heartbeat = dict(cluster.state.node("g1"))
        heartbeat["metadata"] = dict(heartbeat["metadata"], resourceVersion="99")
        epoch = engine.published.plan.epoch
        cluster.state.apply("nodes", "MODIFIED", heartbeat)  # same node for the planner
        time.sleep(0.3)
        assert engine.published.plan.epoch == epoch  # a heartbeat is no reason to replan
    finally:
        engine.stop()


def test_a_bind_on_a_view_planned_before_the_sync_replans_first():
    """The extender restarted between kube-scheduler's filter and its bind: the bind
    reaches a process whose cluster view has synced but whose published plan was made
    before (on an empty view).  Filter replans first in that case; bind did not, and
    refused a node it could take ("no GPU inventory known to ElastiCo") with a Refused
    Event.  Now it replans first too and binds.  The real client and the fake API
    server; the engine without its loop thread, so no epoch comes in between."""
    from kubernetes import client

    from elastico_extender.cluster.fake_apiserver import FakeApiServer
    from elastico_extender.cluster.kube import KubeCluster

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0"))
    api.put("pods", elastic_pod("p"))
    kube = KubeCluster(client.ApiClient(client.Configuration(host=api.url)))
    engine = Engine(ServiceSettings(epoch_seconds=3600), kube)
    try:
        engine.run_epoch()  # the plan made at start, before the view synced
        kube.start()
        assert kube.wait_synced(15)
        assert not engine.bookings.published.synced
        assert engine.bind("ml", "p", "uid-p", "g0") == ""
        assert [b["target"]["name"] for b in api.bindings] == ["g0"]
        assert engine.published.synced
    finally:
        kube.stop()
        api.stop()
