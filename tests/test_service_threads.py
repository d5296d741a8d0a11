"""Shared state between the extender's threads: each race made to happen, then shown gone.

The event loop serves filter/prioritize and the REST views; bind, ``POST /observations``
and ``POST /epoch`` run on the threadpool; the epoch loop, the watch, the elector, the
checkpoint writer and the event recorder each have a thread of their own.  The races
below are driven with the real service objects, either by two threads hammering both
sides (with a tiny switch interval, so the interpreter changes threads mid-loop) or by
a deterministic interleaving through the objects' own seams.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_service_behaviour import elastic_pod, gpu_node
from test_service_observations import running_pod

from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.closed_loop import ClosedLoop
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.shapes.catalog import catalog_families
from elastico_extender.errors import ClusterError
from elastico_extender.profiles.loop_store import LoopStore
from elastico_extender.service.engine import Engine
from elastico_extender.service.observations import AgentWindow, ObservationService
from elastico_extender.service.settings import ServiceSettings

BERT = catalog_families()["bert"]
SOLO = float(BERT.throughput[BERT.fastest_index])


@pytest.fixture
def switch_often() -> Iterator[None]:
    """Let the interpreter switch threads every microsecond, as a loaded server might
    at the worst moment: a race that needs a switch mid-loop happens within a few tries."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_get_observations_while_agents_post_never_fails(switch_often: None) -> None:
    """GET /observations (event loop) read the observation book without the service's
    lock while POST /observations (threadpool) recorded windows into it: the book's
    ordered dict changed during the view's iteration, a RuntimeError, so a 500."""
    nodes, per_node = 16, 8
    cluster = EmbeddedCluster(
        [gpu_node(f"g{n}", gpus=per_node, memory_mib=81920) for n in range(nodes)], "test"
    )
    for n in range(nodes):
        for d in range(per_node):
            cluster.add_pod(running_pod(f"p{n}-{d}", f"g{n}", d))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    service = ObservationService(ServiceSettings())
    service.attach(lambda: engine.published)
    stop = threading.Event()
    failures: list[BaseException] = []

    def agents() -> None:  # every node's agent, one batch after another
        end = time.time() - 60.0
        while not stop.is_set():
            end += 0.01
            for n in range(nodes):
                windows = [
                    AgentWindow(f"uid-p{n}-{d}", end, 5.0, SOLO / 1.5, BERT.throughput_unit)
                    for d in range(per_node)
                ]
                try:
                    service.ingest(f"g{n}", windows)
                except Exception as exc:  # reported by the test
                    failures.append(exc)
                    return

    poster = threading.Thread(target=agents)
    poster.start()
    try:
        deadline = time.monotonic() + 10.0
        views = 0
        while time.monotonic() < deadline and views < 300 and not failures:
            service.view()
            views += 1
    finally:
        stop.set()
        poster.join()
    assert failures == []
    assert len(service.view()["pods"]) == nodes * per_node


class RefusingCluster(EmbeddedCluster):
    """An API server that refuses every Binding with a 403 (nothing written: RBAC, a
    quota); the first refusal waits until ``go`` is set, so a test can hold a bind
    between its booking and its release."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.writing = threading.Event()
        self.go = threading.Event()
        self.attempts = 0

    def bind(self, request: BindRequest) -> None:
        self.attempts += 1
        self.writing.set()
        self.go.wait(10)
        raise ClusterError("API server answered 403: Forbidden", status=403)


def test_a_bind_released_while_the_epoch_plans_is_not_held_by_the_new_view() -> None:
    """Bind (threadpool) booked a pod, the epoch (its own thread) read the bookings and
    planned, the write failed for certain and the booking was released, then the epoch
    published: the new view held the pod as running where it was booked, so the
    scheduler's retry of the bind was answered "" (already placed) with nothing
    written: a pod reported bound that never was."""
    cluster = RefusingCluster([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("a"))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    first: list[str] = []
    binder = threading.Thread(target=lambda: first.append(engine.bind("ml", "a", "uid-a", "g0")))
    binder.start()
    assert cluster.writing.wait(10)  # booked; the Binding is being written
    build = engine.builder.build

    def build_then_release(bookings):  # type: ignore[no-untyped-def]
        built = build(bookings)  # the snapshot counts the booking
        cluster.go.set()  # the API server answers 403: the booking is released
        binder.join(10)
        return built

    engine.builder.build = build_then_release  # type: ignore[method-assign]
    engine.run_epoch()
    engine.builder.build = build  # type: ignore[method-assign]
    assert first and "403" in first[0]
    assert len(engine.bookings) == 0
    assert not engine.published.view.holds("uid-a")
    retry = engine.bind("ml", "a", "uid-a", "g0")  # kube-scheduler retries the pod
    assert "403" in retry
    assert cluster.attempts == 2 and cluster.bindings == []


def test_a_filter_naming_a_node_the_epoch_thread_is_planning_for_waits_for_that_plan() -> None:
    """A node is added; the epoch thread's poll notices first and plans.  A filter naming
    the new node meanwhile (kube-scheduler moves pending pods to its active queue on the
    same Node event) must replan or wait for that plan (issue 12 item 2).  The poll had
    consumed the node generation in the loop's shared "already checked" memo, so the
    filter's refresh found nothing stale and answered from the old view: the new node
    was "not in the cluster view", an unresolvable failure (the pod back in the
    unschedulable queue for up to 5 minutes)."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("a"))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.start()  # the epoch thread polls for node changes every 50 ms
    planning, go = threading.Event(), threading.Event()
    build = engine.builder.build

    def slow_build(bookings):  # type: ignore[no-untyped-def]
        if threading.current_thread().name == "elastico-epoch":
            planning.set()
            go.wait(10)
        return build(bookings)

    engine.builder.build = slow_build  # type: ignore[method-assign]
    try:
        cluster.state.apply("nodes", "ADDED", gpu_node("g1"))
        assert planning.wait(10)  # the epoch thread noticed and is planning
        outcome: list[object] = []
        verb = threading.Thread(
            target=lambda: outcome.append(engine.filter(cluster.state.pod("uid-a"), ["g1"]))
        )
        verb.start()
        verb.join(0.5)
        go.set()
        verb.join(10)
    finally:
        go.set()
        engine.stop()
    (result,) = outcome
    assert result.passed == ["g1"], result  # type: ignore[attr-defined]


def test_answers_of_a_view_replaced_while_filter_ran_are_not_cached_for_the_next_pod() -> None:
    """Filter (event loop) reads the published view, then takes the view lock; the epoch
    thread may publish in between.  The answer computed on the old view was cached
    under the new view's version, so every later pod of the same shape got the old
    view's answer: here a node another replica filled since was passed again."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()  # g0 idle
    for name in ("b", "c"):  # bert needs >= 22 GiB: one per 40 GiB GPU
        cluster.add_pod(elastic_pod(name))
    taken = running_pod("x", "g0", 0)  # bound by the leader: the watch shows it
    cluster.state.apply("pods", "ADDED", taken)
    distinct = engine.verbs._distinct
    epochs: list[object] = []

    def distinct_then_publish(view, names):  # type: ignore[no-untyped-def]
        found = distinct(view, names)
        if not epochs:  # the epoch thread publishes while filter is between the two
            epochs.append(engine.run_epoch())
        return found

    engine.verbs._distinct = distinct_then_publish  # type: ignore[method-assign]
    engine.filter(cluster.state.pod("uid-b"), ["g0"])  # answered from the old view
    engine.verbs._distinct = distinct  # type: ignore[method-assign]
    assert epochs and engine.published.view.holds("uid-x")
    later = engine.filter(cluster.state.pod("uid-c"), ["g0"])
    assert later.passed == [] and "g0" in later.failed, later


def test_the_epoch_thread_survives_a_failure_while_it_polls_for_node_changes() -> None:
    """Between epochs the thread polls whether the cluster view moved (parsing the
    nodes); an error there, outside the epoch's own guard, ended the thread silently and
    no plan was ever made again.  The poll's error is logged and the next epoch runs."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.start()
    nodes = engine.builder.nodes
    failures = [RuntimeError("node parse failed")]

    def flaky_nodes():  # type: ignore[no-untyped-def]
        if failures and threading.current_thread().name == "elastico-epoch":
            raise failures.pop()
        return nodes()

    engine.builder.nodes = flaky_nodes  # type: ignore[method-assign]
    try:
        first = engine.published.plan.epoch
        cluster.state.apply("nodes", "ADDED", gpu_node("g1"))  # the poll parses the nodes
        deadline = time.monotonic() + 10
        while engine.published.plan.epoch == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not failures  # the poll did fail once
        assert engine.published.plan.epoch > first  # and the thread planned the new node
        assert [n.name for n in engine.published.snapshot.nodes] == ["g0", "g1"]
    finally:
        engine.stop()


def test_get_observations_is_answered_while_an_ingest_waits_on_the_store(
    tmp_path: Path,
) -> None:
    """POST /observations (threadpool) wrote what its windows taught to SQLite while it
    held the service's lock, and GET /observations and /metrics (event loop) take that
    lock: a store slow to write (disk I/O, fsync, or another writer: here a write
    transaction held from a second connection) stalled the event loop, and with it every
    filter and prioritize, for as long as the write took.  The view is answered at once
    now, and the write lands when the store is free again."""
    cluster = EmbeddedCluster([gpu_node("g0", gpus=1, memory_mib=81920)], "test")
    for name in ("a", "b"):  # two tenants of one GPU: their windows label a pair
        cluster.add_pod(running_pod(name, "g0", 0))
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    store = LoopStore(tmp_path / "loop.db")
    service = ObservationService(
        ServiceSettings(), store, loop=ClosedLoop(OnlineCorrection(ContentionPredictor()))
    )
    service.attach(lambda: engine.published)
    writer = sqlite3.connect(tmp_path / "loop.db")
    writer.execute("BEGIN IMMEDIATE")  # another writer holds the file's write lock
    end = time.time() - 30.0
    windows = [AgentWindow(f"uid-{n}", end, 5.0, SOLO / 1.5, BERT.throughput_unit) for n in "ab"]
    posted: list[dict] = []
    poster = threading.Thread(target=lambda: posted.append(service.ingest("g0", windows)))
    poster.start()
    try:
        deadline = time.monotonic() + 10.0
        while not store._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.001)  # until the ingest is in the store, waiting for the file
        assert poster.is_alive() and store._lock.locked()
        viewed: list[dict] = []
        viewer = threading.Thread(target=lambda: viewed.append(service.view()))
        viewer.start()
        viewer.join(1.0)  # the store's busy timeout is 5 s
        assert viewed, "GET /observations waited for the ingest's SQLite write"
        assert {p["id"] for p in viewed[0]["pods"]} == {"uid-a", "uid-b"}
    finally:
        writer.rollback()
        writer.close()
        poster.join(10)
    assert posted and posted[0]["pair_samples"] == 2
    x, _ = store.samples()
    assert len(x) > 0 and len(store.pair_records()) == 2  # written once the file was free
