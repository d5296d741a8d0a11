"""Bind books placements through one serialised path (issue 12 items 1 and 14, and the
concurrency proof): idempotent per pod UID, conflicting binds refused with the first
placement kept, a placement never forgotten on a retry or an "already bound" answer,
and the pod always taken from the cluster view, never from a filter caller's body."""

from __future__ import annotations

import random
import threading

from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


def engine_on(cluster: EmbeddedCluster, **settings: float) -> Engine:
    engine = Engine(ServiceSettings(epoch_seconds=3600, **settings), cluster)
    engine.run_epoch()
    return engine


def pods_on(engine: Engine, node: str) -> list[str]:
    rows = [row for row in engine.nodes() if row["name"] == node]
    return [p for row in rows for g in row["gpus"] for p in g["pods"]]


def test_a_retried_bind_on_the_same_node_succeeds_and_keeps_the_placement():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    for name in ("a", "b"):
        cluster.add_pod(elastic_pod(name))  # bert needs >= 22 GiB: two never fit 40 GiB
    engine = engine_on(cluster)
    assert engine.bind("ml", "a", "uid-a", "g0") == ""
    assert engine.bind("ml", "a", "uid-a", "g0") == ""  # kube-scheduler retries after a timeout
    assert pods_on(engine, "g0") == ["ml/a"]
    assert engine.filter(cluster.state.pod("uid-b"), ["g0"]).passed == []
    assert "cannot take" in engine.bind("ml", "b", "uid-b", "g0")
    assert len(cluster.bindings) == 1


def test_a_bind_to_another_node_is_refused_and_the_first_placement_kept():
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1")], "test")
    for name in ("a", "b", "c"):
        cluster.add_pod(elastic_pod(name))
    engine = engine_on(cluster)
    assert engine.bind("ml", "a", "uid-a", "g0") == ""
    refused = engine.bind("ml", "a", "uid-a", "g1")
    assert "already bound to g0" in refused
    assert pods_on(engine, "g0") == ["ml/a"] and "ml/a" not in pods_on(engine, "g1")
    assert engine.bind("ml", "b", "uid-b", "g1") == ""
    assert "cannot take" in engine.bind("ml", "c", "uid-c", "g0")
    assert "cannot take" in engine.bind("ml", "c", "uid-c", "g1")
    assert [b["target"]["name"] for b in cluster.bindings] == ["g0", "g1"]


class LostReplyCluster(EmbeddedCluster):
    """The Binding is written but the reply is lost: the watch shows nothing yet and a
    retried bind is answered "already bound" by the API server."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.written: set[str] = set()

    def bind(self, request: BindRequest) -> None:
        from elastico_extender.errors import ClusterError

        if request.uid in self.written:
            raise ClusterError(f"pod {request.name} is already assigned to node {request.node}",
                               status=409)  # fmt: skip
        self.written.add(request.uid)
        self.bindings.append({"target": {"name": request.node}, "request": request})
        raise ClusterError("API server unreachable: read timed out")


def test_an_already_bound_answer_never_forgets_the_placement():
    cluster = LostReplyCluster([gpu_node("g0")], "test")
    for name in ("a", "b"):
        cluster.add_pod(elastic_pod(name))
    engine = engine_on(cluster)
    assert engine.bind("ml", "a", "uid-a", "g0") != ""  # timed out: unknown outcome
    engine.bind("ml", "a", "uid-a", "g0")  # the retry: "already bound"
    engine.run_epoch()  # the watch still shows a pending: the booking must survive
    assert pods_on(engine, "g0") == ["ml/a"]
    assert engine.filter(cluster.state.pod("uid-b"), ["g0"]).passed == []
    assert "cannot take" in engine.bind("ml", "b", "uid-b", "g0")


class RecordingCluster(EmbeddedCluster):
    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.requests: list[BindRequest] = []

    def bind(self, request: BindRequest) -> None:
        self.requests.append(request)
        super().bind(request)


def test_bind_takes_the_pod_from_the_cluster_view_not_from_a_filter_body():
    cluster = RecordingCluster([gpu_node("g0", gpus=2)], "test")
    cluster.add_pod(elastic_pod("real"))
    engine = engine_on(cluster)
    planted = elastic_pod("ghost")  # never created: only an (unauthenticated) filter saw it
    engine.filter(planted, ["g0"])
    error = engine.bind("ml", "ghost", "uid-ghost", "g0")
    assert "not in its cluster view" in error
    assert cluster.requests == []
    forged = elastic_pod("real", "llama3-8b-infer")  # the real pod's UID, another body
    forged["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    engine.filter(forged, ["g0"])
    assert engine.bind("ml", "real", "uid-real", "g0") == ""
    (request,) = cluster.requests
    assert request.annotations["elastico.io/assigned-devices"] == "0"  # one GPU, as created


class CapacityCheckingCluster(EmbeddedCluster):
    """Records, at every Binding, whether any device's booked memory (the decisions of
    every pod bound so far) exceeds its capacity."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.booked: dict[tuple[str, str], float] = {}
        self.over: list[tuple[str, str, float]] = []
        self.check = threading.Lock()

    def bind(self, request: BindRequest) -> None:
        super().bind(request)
        with self.check:
            budget = float(request.annotations.get("elastico.io/memory-budget-mib", 0) or 0)
            for d in request.annotations.get("elastico.io/assigned-devices", "").split(","):
                if not d:
                    continue
                key = (request.node, d)
                self.booked[key] = self.booked.get(key, 0.0) + budget
                if self.booked[key] > 40960:
                    self.over.append((request.node, d, self.booked[key]))


def test_competing_filter_and_bind_sequences_never_overbook_a_device():
    nodes = [gpu_node(f"g{i}", gpus=2) for i in range(3)]
    cluster = CapacityCheckingCluster(nodes, "test")
    names = [f"p{i}" for i in range(24)]  # 24 pods of >= 22 GiB onto 6 GPUs of 40 GiB
    families = ["bert", "resnet50", "llama3-8b-infer", "gpt2"]
    for i, name in enumerate(names):
        cluster.add_pod(elastic_pod(name, families[i % len(families)]))
    engine = engine_on(cluster)
    results: list[tuple[str, str, str]] = []
    record = threading.Lock()
    stop = threading.Event()

    def epochs() -> None:
        while not stop.is_set():
            engine.run_epoch()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        order = names[:]
        rng.shuffle(order)
        for name in order:
            pod = cluster.state.pod_by_name("ml", name)
            passed = engine.filter(pod, [f"g{i}" for i in range(3)]).passed
            targets = passed[:1] if passed else []
            if rng.random() < 0.5:
                targets.append(f"g{rng.randrange(3)}")  # a conflicting or duplicate bind
            for node in targets:
                error = engine.bind("ml", name, f"uid-{name}", node)
                with record:
                    results.append((name, node, error))

    epoch_thread = threading.Thread(target=epochs)
    epoch_thread.start()
    threads = [threading.Thread(target=worker, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    epoch_thread.join()
    assert cluster.over == []
    bound = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.state.pods().values()
             if p["spec"].get("nodeName")}  # fmt: skip
    assert 0 < len(bound) < len(names)
    for name, node, error in results:
        if error == "":
            assert bound.get(name) == node  # every success names where the pod really is
    engine.run_epoch()
    for row in engine.nodes():
        for gpu in row["gpus"]:
            assert gpu["memory_assigned_mib"] <= gpu["memory_mib"]


def test_a_bind_made_while_the_epoch_plans_wins_over_the_plans_proposal():
    """Binds do not wait for planning: a booking made after the snapshot was read is
    counted in the view the epoch publishes, and a plan's proposal for a pending pod
    on the same GPU gives way to it."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    engine = engine_on(cluster)  # an empty first plan
    first = elastic_pod("a")
    first["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"  # a arrived first
    second = elastic_pod("b")
    second["metadata"]["creationTimestamp"] = "2026-01-02T00:00:00Z"
    cluster.add_pod(first)
    cluster.add_pod(second)
    build = engine.builder.build
    results: list[str] = []

    def build_then_bind(bookings):  # type: ignore[no-untyped-def]
        built = build(bookings)
        if not results:  # the scheduler binds b while this epoch plans
            results.append(engine.bind("ml", "b", "uid-b", "g0"))
        return built

    engine.builder.build = build_then_bind  # type: ignore[method-assign]
    engine.run_epoch()
    assert results == [""]
    view = engine.published.view
    assert view.devices_of("uid-b") == (("g0", 0),)
    assert not view.holds("uid-a")  # the proposal gave way
    assert engine.filter(cluster.state.pod("uid-a"), ["g0"]).passed == []
    assert "cannot take" in engine.bind("ml", "a", "uid-a", "g0")
