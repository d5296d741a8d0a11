"""HA: two extender replicas elect a leader through a Lease on the fake API server; only the
leader binds; when it dies the follower takes over, with no GPU booked twice and no
decision lost."""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.cluster.state import ClusterState
from elastico_extender.service.engine import Engine
from elastico_extender.service.leader import (
    LEADER_LABEL,
    LeaderElector,
    LeaseTiming,
    elect,
    view_caught_up,
)
from elastico_extender.service.pods import DECISION_VOLUME
from elastico_extender.service.settings import ServiceSettings

TIMING = LeaseTiming(lease_duration=1.5, renew_deadline=1.0, retry_period=0.1)
DEVICE_MIB = 40960


def gpu_node(name: str) -> dict:
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": str(DEVICE_MIB),
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "1", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def job_pod(name: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": {"elastico.io/family": "bert"}},
        "spec": {"schedulerName": "elastico-scheduler", "containers": [{"name": "main",
                 "image": "img", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                 # admitted through the webhook, as its downward-API volume shows
                 "volumes": [{"name": DECISION_VOLUME, "downwardAPI": {"items": []}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if condition():
            return time.monotonic() - start
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


class Replica:
    def __init__(self, server: FakeApiServer, identity: str) -> None:
        api = client.ApiClient(client.Configuration(host=server.url))
        self.kube = KubeCluster(api, resync_seconds=300, watch_timeout_seconds=30)
        self.elector, self.cluster = elect(
            self.kube, api, name="elastico-extender", namespace="elastico-system",
            identity=identity, timing=TIMING,
        )  # fmt: skip
        self.engine = Engine(ServiceSettings(epoch_seconds=60), self.cluster)
        self.cluster.start()
        assert self.kube.wait_synced(15)
        self.engine.start()

    def bind(self, name: str, node: str) -> str:
        self.engine.run_epoch()
        return self.engine.bind("ml", name, f"uid-{name}", node)

    def crash(self) -> None:
        """Die without releasing the Lease (a killed pod)."""
        self.engine.stop()
        self.elector.stop(release=False)
        self.kube.stop()

    def stop(self) -> None:
        self.engine.stop()
        self.cluster.stop()


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    srv = FakeApiServer().start()
    for n in range(3):
        srv.put("nodes", gpu_node(f"gpu-{n}"))
    for p in range(12):
        srv.put("pods", job_pod(f"job-{p:02d}"))
    yield srv
    srv.stop()


def bound(server: FakeApiServer) -> dict[str, dict]:
    return {k: p for k, p in server.objects["pods"].items() if p["spec"].get("nodeName")}


def test_only_the_leader_binds_and_the_follower_takes_over_without_double_booking(server):
    a = Replica(server, "replica-a")
    wait_for(a.elector.is_leader)
    b = Replica(server, "replica-b")
    try:
        time.sleep(3 * TIMING.retry_period)
        assert not b.elector.is_leader()
        # The follower plans on its own synced view but refuses to write.
        refused = b.bind("job-00", "gpu-0")
        assert "not the ElastiCo leader" in refused and "replica-a" in refused
        assert not bound(server)
        for i, name in enumerate(["job-00", "job-01", "job-02", "job-03"]):
            a.bind(name, f"gpu-{i % 3}")
        before = set(bound(server))
        assert before
        # The leader dies right after binding one more pod.
        a.bind("job-04", "gpu-0")
        a.crash()
        takeover = wait_for(b.elector.is_leader)
        assert takeover <= TIMING.lease_duration + 2 * TIMING.retry_period + 1.0
        lease = server.store.get("coordination.k8s.io", "leases", "elastico-system",
                                 "elastico-extender")  # fmt: skip
        assert lease and lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] >= 1
        for i in range(5, 12):
            b.bind(f"job-{i:02d}", f"gpu-{i % 3}")
        pods = bound(server)
        assert before <= set(pods)  # nothing the old leader bound was undone
        # No GPU promised twice: the memory budgets on each device fit the device.
        used: dict[tuple[str, str], float] = defaultdict(float)
        for pod in pods.values():
            ann = pod["metadata"]["annotations"]
            # no decision lost: every bound pod carries its decision and its ConfigMap
            assert ann["elastico.io/assigned-devices"] != ""
            assert ("ml", ann["elastico.io/configmap"]) in server.configmaps
            for device in ann["elastico.io/assigned-devices"].split(","):
                used[(pod["spec"]["nodeName"], device)] += float(
                    ann["elastico.io/memory-budget-mib"]
                )
        assert used and max(used.values()) <= DEVICE_MIB
        # b's view has every pod a bound before it died
        b_view = {f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                  for p in b.kube.state.pods().values() if p["spec"].get("nodeName")}  # fmt: skip
        assert before <= b_view
    finally:
        b.stop()


def test_a_clean_stop_releases_the_lease_for_an_immediate_takeover(server):
    a = Replica(server, "replica-a")
    wait_for(a.elector.is_leader)
    b = Replica(server, "replica-b")
    try:
        a.stop()
        takeover = wait_for(b.elector.is_leader)
        assert takeover < TIMING.lease_duration  # no waiting for expiry
    finally:
        b.stop()


def test_two_candidates_racing_for_a_free_lease_produce_one_leader(server):
    api = client.ApiClient(client.Configuration(host=server.url))
    electors = [
        LeaderElector(api, name="race", namespace="ns", identity=f"c{i}", timing=TIMING)
        for i in range(4)
    ]
    barrier = threading.Barrier(len(electors))
    wins: list[bool] = [False] * len(electors)

    def go(i: int) -> None:
        barrier.wait()
        wins[i] = electors[i].try_acquire_or_renew()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(electors))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(wins) == 1
    # a second round: the holder renews, nobody else acquires before expiry
    assert [e.try_acquire_or_renew() for e in electors] == wins


def test_a_leader_that_cannot_renew_stops_leading_before_the_lease_expires(server):
    api = client.ApiClient(client.Configuration(host=server.url))
    now = [0.0]
    elector = LeaderElector(api, name="l", namespace="ns", identity="x", timing=TIMING,
                            clock=lambda: now[0])  # fmt: skip
    elector.step()
    assert elector.is_leader()
    now[0] = TIMING.renew_deadline - 0.01
    assert elector.is_leader()
    now[0] = TIMING.renew_deadline + 0.01  # no renewal since: writes must stop
    assert not elector.is_leader()
    assert TIMING.renew_deadline < TIMING.lease_duration


def test_a_leader_cut_off_from_the_api_server_steps_down_and_fences_again(server):
    """No answer at all (connection refused, not an HTTP error): the leader must give up
    leading once it cannot renew, as for a refused renewal, and a later re-acquisition
    must pass the catch-up fence again (another replica may have bound pods meanwhile)."""
    api = client.ApiClient(client.Configuration(host=server.url))
    now = [0.0]
    fenced: list[float] = []
    stopped: list[float] = []
    elector = LeaderElector(api, name="cut", namespace="ns", identity="x", timing=TIMING,
                            clock=lambda: now[0])  # fmt: skip
    elector.on_started = lambda: fenced.append(now[0]) is None
    elector.on_stopped = lambda: stopped.append(now[0])
    elector.step()
    assert elector.is_leader() and fenced == [0.0]
    api.configuration.host = "http://127.0.0.1:9"  # nothing listens there
    now[0] = TIMING.retry_period
    elector.step()  # still within the renew deadline: leading, writes allowed
    assert elector.is_leader() and stopped == []
    now[0] = TIMING.renew_deadline + 0.01
    elector.step()
    assert not elector.is_leader() and stopped == [now[0]]
    api.configuration.host = server.url  # back
    now[0] += TIMING.retry_period
    elector.step()
    assert elector.is_leader() and fenced == [0.0, now[0]]


def test_a_leader_stopping_while_the_api_server_is_away_still_stops(server):
    """Shutdown with no API server to answer: releasing the Lease and taking the leader
    label off the pod fail (logged), and stop() still returns, the informers stopped."""
    api = client.ApiClient(client.Configuration(host=server.url))
    kube = KubeCluster(api, resync_seconds=300, watch_timeout_seconds=30)
    elector, cluster = elect(kube, api, name="away", namespace="ns", identity="x",
                             timing=TIMING)  # fmt: skip
    cluster.start()
    try:
        wait_for(elector.is_leader)
    finally:
        api.configuration.host = "http://127.0.0.1:9"  # nothing listens there
        cluster.stop()
    assert not elector.is_leader()
    assert all(not t.is_alive() for t in kube._threads) and kube._threads == []


def test_a_lease_request_that_gets_no_reply_ends_the_step_in_bounded_time():
    """An API server that accepts and never answers must not hold the election thread:
    each Lease request waits at most the renew deadline."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}"))
    elector = LeaderElector(api, name="hung", namespace="ns", identity="x", timing=TIMING)
    thread = threading.Thread(target=elector.step, daemon=True)
    thread.start()
    thread.join(timeout=20)
    alive = thread.is_alive()
    silent.close()
    assert not alive, "the election step was still waiting for the API server"
    assert not elector.is_leader()


def test_view_caught_up_compares_resource_versions():
    state = ClusterState()
    pod = {"metadata": {"uid": "u1", "name": "p", "namespace": "ml", "resourceVersion": "7"}}
    state.replace("pods", [pod], "7")
    assert view_caught_up({"u1": "7"}, state)
    assert view_caught_up({"u1": "6"}, state)
    assert not view_caught_up({"u1": "9"}, state)  # the view lags the list
    assert not view_caught_up({"u2": "3"}, state)  # a pod the view has not seen


def test_serve_wires_leader_election_from_settings_and_reports_it_as_a_metric(server, tmp_path):
    import yaml

    from elastico_extender.service.cli import _report_leadership, build_cluster
    from elastico_extender.service.metrics import PrometheusMetrics

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "c", "cluster": {"server": server.url}}],
        "users": [{"name": "u", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    settings = ServiceSettings.load(env={}, overrides={
        "kubeconfig": str(kubeconfig), "leader_election": True, "lease_namespace": "ops",
        "identity": "replica-x", "lease_duration_seconds": 1.5,
        "renew_deadline_seconds": 1.0, "retry_period_seconds": 0.1,
    })  # fmt: skip
    cluster = build_cluster(settings)
    metrics = PrometheusMetrics()
    _report_leadership(cluster, metrics)
    cluster.start()
    try:
        wait_for(cluster.elector.is_leader)
        assert metrics.registry.get_sample_value("elastico_leader") == 1
        lease = server.store.get("coordination.k8s.io", "leases", "ops", "elastico-extender")
        assert lease and lease["spec"]["holderIdentity"] == "replica-x"
    finally:
        cluster.stop()
    lease = server.store.get("coordination.k8s.io", "leases", "ops", "elastico-extender")
    assert lease["spec"]["holderIdentity"] == ""  # released on a clean stop
    assert metrics.registry.get_sample_value("elastico_leader") == 0


def test_a_catch_up_list_that_gets_no_answer_is_a_fence_not_passed(server):
    """The Lease was won but the consistent list gets no answer: not leading yet (a
    warning, no traceback), and leading at a later step once the list answers."""
    from elastico_extender.service.leader import catch_up_fence

    api = client.ApiClient(client.Configuration(host=server.url))
    state = ClusterState()
    state.replace("pods", list(server.objects["pods"].values()), str(server.rv))
    fence_api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    elector = LeaderElector(api, name="gap", namespace="ns", identity="x", timing=TIMING)
    elector.on_started = catch_up_fence(client.CoreV1Api(fence_api), state, timeout=0.3)
    elector.step()
    assert not elector.is_leader()
    fence_api.configuration.host = server.url
    elector.step()
    assert elector.is_leader()


def test_a_replica_whose_view_lags_the_api_server_does_not_start_leading(server):
    from elastico_extender.service.leader import catch_up_fence

    api = client.ApiClient(client.Configuration(host=server.url))
    core = client.CoreV1Api(api)
    state = ClusterState()
    state.replace("pods", [], "0")  # a view that has seen none of the server's 12 pods
    fence = catch_up_fence(core, state, timeout=0.3)
    assert fence() is False
    elector = LeaderElector(api, name="lag", namespace="ns", identity="x", timing=TIMING)
    elector.on_started = fence
    elector.step()
    assert not elector.is_leader()  # holds the Lease, but will not write on a stale view
    state.replace("pods", list(server.objects["pods"].values()), str(server.rv))
    elector.step()
    assert elector.is_leader()


def test_a_lease_deleted_by_an_admin_never_gives_two_leaders(server):
    """`kubectl delete lease` while a leader lives: the follower that notices first must
    not create the Lease for itself while the leader, which has not lost its claim by
    any clock, keeps writing; the live leader recreates it and goes on leading."""
    api = client.ApiClient(client.Configuration(host=server.url))
    now = [0.0]

    def clock() -> float:
        return now[0]

    a, b = (
        LeaderElector(api, name="del", namespace="ns", identity=who, timing=TIMING, clock=clock)
        for who in ("a", "b")
    )
    a.step()
    b.step()
    assert a.is_leader() and not b.is_leader()
    status, _ = server.store.handle(
        "DELETE", "/apis/coordination.k8s.io/v1/namespaces/ns/leases/del", None
    )
    assert status == 200
    now[0] += TIMING.retry_period
    b.step()  # the follower's retry comes first
    a.step()
    assert not (a.is_leader() and b.is_leader())
    assert a.is_leader()
    lease = server.store.get("coordination.k8s.io", "leases", "ns", "del")
    assert lease and lease["spec"]["holderIdentity"] == "a"
    # the leader dies: the follower takes over once the recreated Lease expires
    while not b.is_leader():
        now[0] += TIMING.retry_period
        b.step()
        assert not (a.is_leader() and b.is_leader())
    assert now[0] >= TIMING.lease_duration


def test_a_leader_that_finds_the_lease_held_by_another_stops_at_once(server):
    """An admin hands the Lease to another replica (holderIdentity edited to force a
    fail-over): the old leader stops writing at its next retry, not after its renew
    deadline while the new holder already leads."""
    api = client.ApiClient(client.Configuration(host=server.url))
    now = [0.0]
    stopped: list[float] = []
    a = LeaderElector(api, name="edit", namespace="ns", identity="a", timing=TIMING,
                      clock=lambda: now[0], on_stopped=lambda: stopped.append(now[0]))  # fmt: skip
    a.step()
    assert a.is_leader()
    path = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/edit"
    status, _ = server.store.handle("PATCH", path, {"spec": {"holderIdentity": "b"}})
    assert status == 200
    now[0] += TIMING.retry_period
    a.step()
    assert not a.is_leader() and stopped == [now[0]]
    assert a.holder == "b"


def test_a_leaders_claim_runs_from_before_its_renewal_was_sent(server):
    """A renewal lands and its answer comes late (the leader paused, a slow network back):
    a follower saw the renewed record when it landed and may take over a lease duration
    later, so the leader must count its renew deadline from before it sent the renewal,
    not from the answer, or both lead for a while."""
    now = [0.0]

    def clock() -> float:
        return now[0]

    a_api = client.ApiClient(client.Configuration(host=server.url))
    b_api = client.ApiClient(client.Configuration(host=server.url))
    timing = LeaseTiming(lease_duration=2.0, renew_deadline=1.5, retry_period=0.1)
    a = LeaderElector(a_api, name="late", namespace="ns", identity="a", timing=timing, clock=clock)
    b = LeaderElector(b_api, name="late", namespace="ns", identity="b", timing=timing, clock=clock)
    a.step()
    b.step()
    assert a.is_leader() and not b.is_leader()
    lease = server.store.get("coordination.k8s.io", "leases", "ns", "late")
    assert lease
    # longer than the margin between the follower's wait and the leader's deadline
    pause = lease["spec"]["leaseDurationSeconds"] - timing.renew_deadline + 0.2

    def late_answer(method: str, path: str) -> None:
        if method == "PUT" and "/leases/" in path:
            b.step()  # the follower reads the renewal as soon as it landed
            now[0] += pause

    server.before_reply = late_answer
    now[0] += timing.retry_period
    a.step()
    server.before_reply = None
    assert a.is_leader()
    a_api.configuration.host = "http://127.0.0.1:9"  # then cut off: no more renewals
    while not b.is_leader():
        now[0] += timing.retry_period
        a.step()
        b.step()
        assert not (a.is_leader() and b.is_leader()), f"two leaders at t={now[0]:.1f}"


def test_a_fractional_lease_duration_is_not_cut_below_the_renew_deadline_on_the_wire(server):
    """leaseDurationSeconds is whole seconds: 1.4 s written as 1 would let followers take
    over 1 s after a renewal while the leader writes for 1.2 s."""
    api = client.ApiClient(client.Configuration(host=server.url))
    timing = LeaseTiming(lease_duration=1.4, renew_deadline=1.2, retry_period=0.1)
    LeaderElector(api, name="frac", namespace="ns", identity="a", timing=timing).step()
    lease = server.store.get("coordination.k8s.io", "leases", "ns", "frac")
    assert lease and lease["spec"]["leaseDurationSeconds"] >= timing.lease_duration


def leader_labelled(server: FakeApiServer) -> set[str]:
    """Names of the pods the extender Service selects (labelled leader)."""
    return {
        p["metadata"]["name"]
        for p in server.objects["pods"].values()
        if (p["metadata"].get("labels") or {}).get(LEADER_LABEL) == "true"
    }


def test_a_stale_leader_label_comes_off_a_follower_pod(server):
    """The Service selects every pod labelled leader. A leader killed (its container
    restarts in the same pod) or cut off from the API server when it stepped down (the
    label could not be removed) comes back as a follower still labelled: it must take the
    label off, or half the scheduler's binds and the agents' windows go to a replica that
    refuses them, for as long as it runs."""
    for name in ("replica-a", "replica-b"):
        server.put("pods", {"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": name, "namespace": "elastico-system"},
                            "spec": {"containers": [{"name": "extender", "image": "x"}]},
                            "status": {"phase": "Running"}})  # fmt: skip
    a = Replica(server, "replica-a")
    wait_for(lambda: leader_labelled(server) == {"replica-a"})
    a.crash()
    b = Replica(server, "replica-b")
    try:
        wait_for(b.elector.is_leader)
        a = Replica(server, "replica-a")  # restarted in the same pod, now a follower
        try:
            wait_for(lambda: leader_labelled(server) == {"replica-b"}, timeout=5)
            # the leader is cut off: it steps down but cannot take its label off
            b.kube.api.api_client.configuration.host = "http://127.0.0.1:9"
            wait_for(a.elector.is_leader)
            assert leader_labelled(server) >= {"replica-a", "replica-b"}
            b.kube.api.api_client.configuration.host = server.url  # back, a follower
            wait_for(lambda: leader_labelled(server) == {"replica-a"}, timeout=5)
        finally:
            a.stop()
    finally:
        b.stop()


def test_a_bind_the_follower_refused_holds_no_gpu_when_it_takes_over(server):
    """A follower asked to bind (the Service still pointing at it during a hand-over)
    writes nothing; it must not keep the placement booked either, or once it leads it
    refuses the scheduler's retry of that pod on any other node ("already bound") and
    counts a GPU nobody uses, until the booking expires a minute later."""
    for p in range(1, 12):  # one pending pod: room on every node
        server.delete("pods", f"ml/job-{p:02d}")
    a = Replica(server, "replica-a")
    wait_for(a.elector.is_leader)
    b = Replica(server, "replica-b")
    try:
        b.engine.run_epoch()
        planned = b.engine.published.plan.assignments["uid-job-00"].devices[0][0]
        other = next(f"gpu-{n}" for n in range(3) if f"gpu-{n}" != planned)
        refused = b.engine.bind("ml", "job-00", "uid-job-00", other)
        assert "not the ElastiCo leader" in refused
        assert b.engine.assumed_count() == 0
        a.crash()
        wait_for(b.elector.is_leader)
        assert b.bind("job-00", planned) == ""  # the scheduler's retry, on another node
        assert bound(server)["ml/job-00"]["spec"]["nodeName"] == planned
    finally:
        b.stop()


def test_a_leader_whose_claim_runs_out_between_a_binds_two_writes_does_not_bind(server):
    """bind writes the pod's ConfigMap, then its Binding. On a slow API server the first
    write can outlast the leader's claim; the Binding must not follow, since another
    replica may lead by then and have promised that GPU to another pod."""
    from elastico_extender.cluster.base import BindRequest, ClusterError
    from elastico_extender.service.leader import LeaderGatedCluster

    lease_api = client.ApiClient(client.Configuration(host=server.url))
    elector = LeaderElector(lease_api, name="slow", namespace="ns", identity="a", timing=TIMING)
    elector.step()
    assert elector.is_leader()
    lease_api.configuration.host = "http://127.0.0.1:9"  # its renewals fail from now on
    kube = KubeCluster(client.ApiClient(client.Configuration(host=server.url)))
    gated = LeaderGatedCluster(kube, elector.is_leader, lambda: elector.holder)
    server.write_delay = TIMING.renew_deadline  # the ConfigMap write outlasts the claim
    request = BindRequest("ml", "job-00", "uid-job-00", "gpu-0", {"elastico.io/x": "1"},
                          "cm-job-00", {"K": "v"})  # fmt: skip
    with pytest.raises(ClusterError, match="not the ElastiCo leader"):
        gated.bind(request)
    server.write_delay = 0.0
    assert not bound(server) and not server.bindings
