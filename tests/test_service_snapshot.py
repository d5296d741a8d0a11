"""The service's snapshot keeps one nodes tuple while the cluster is unchanged.

The core memoises its per-cluster device index by the identity of that tuple,
so a heartbeat (a new resourceVersion, same node) must not rebuild it, and a
real change must.
"""

from __future__ import annotations

import copy

import pytest

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.core.model import device_index
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


def gpu_node(name: str, gpus: int, rv: str) -> dict:
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "40960",
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "resourceVersion": rv},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def test_heartbeats_keep_the_nodes_tuple_and_changes_replace_it():
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), gpu_node("b", 4, "1")], "test")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    first = engine.build_snapshot()[0]
    heartbeat = copy.deepcopy(cluster.state.nodes()["a"])
    heartbeat["metadata"]["resourceVersion"] = "2"
    heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    cluster.state.apply("nodes", "MODIFIED", heartbeat)
    second = engine.build_snapshot()[0]
    assert second.nodes is first.nodes
    assert device_index(second.nodes) is device_index(first.nodes)
    cluster.state.apply("nodes", "MODIFIED", gpu_node("a", 8, "3"))  # more GPUs: a change
    third = engine.build_snapshot()[0]
    assert third.nodes is not first.nodes
    assert [len(n.gpus) for n in third.nodes] == [8, 4]
    cluster.state.apply("nodes", "DELETED", gpu_node("b", 4, "4"))
    assert [n.name for n in engine.build_snapshot()[0].nodes] == ["a"]


DECISION_VOLUME = {"name": "elastico-decision", "downwardAPI": {"items": [
    {"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]}}  # fmt: skip
"""What the webhook adds (the extender shares GPUs only with pods that carry it)."""


def bound_pod(name: str, node: str, device: int, family: str = "bert") -> dict:
    annotations = {"elastico.io/family": family, "elastico.io/assigned-node": node,
                   "elastico.io/assigned-devices": str(device)}  # fmt: skip
    limits = {"nvidia.com/gpu": "1"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "t", "uid": f"uid-{name}",
                         "resourceVersion": "1", "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"name": "m", "image": "i",
                     "resources": {"limits": limits, "requests": limits}}],
                     "volumes": [DECISION_VOLUME]},
            "status": {"phase": "Running"}}  # fmt: skip


def test_unchanged_bound_pods_keep_their_records_and_changed_ones_are_read_again():
    pods = [bound_pod("p0", "a", 0), bound_pod("p1", "a", 1), bound_pod("p2", "b", 0)]
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), gpu_node("b", 4, "1"), *pods], "test")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    first = {j.id: j for j in engine.build_snapshot()[0].jobs}
    assert first["uid-p2"].devices == (("b", 0),)
    moved = copy.deepcopy(cluster.state.pod("uid-p2"))
    moved["metadata"]["annotations"]["elastico.io/assigned-devices"] = "3"
    moved["metadata"]["resourceVersion"] = "2"
    cluster.state.apply("pods", "MODIFIED", moved)
    cluster.state.apply("pods", "DELETED", cluster.state.pod("uid-p1"))
    second = {j.id: j for j in engine.build_snapshot()[0].jobs}
    assert second["uid-p0"] is first["uid-p0"]  # same object: not rebuilt
    assert second["uid-p2"].devices == (("b", 3),)
    assert "uid-p1" not in second
    cluster.state.apply("nodes", "MODIFIED", gpu_node("a", 4, "2"))  # node a changed
    third = {j.id: j for j in engine.build_snapshot()[0].jobs}
    assert third["uid-p0"] is not second["uid-p0"] and third["uid-p0"] == second["uid-p0"]
    assert third["uid-p2"] is second["uid-p2"]


def test_a_bound_pod_with_invalid_annotations_is_reported_every_epoch():
    broken = bound_pod("bad", "a", 0)
    broken["metadata"]["annotations"]["elastico.io/mode"] = "sometimes"
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), broken], "test")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    for _ in range(3):
        built = engine.build_snapshot()
        snapshot, invalid = built.snapshot, built.invalid
        assert "elastico.io/mode" in invalid["uid-bad"]
        assert [j.devices for j in snapshot.jobs] == [(("a", 0),)]  # still holds its GPU


def test_a_decision_naming_one_gpu_twice_is_not_taken_as_two():
    """A two-GPU pod whose decision annotation reads "0,0" (hand-edited, or written by a
    tool that is not ElastiCo) would hold GPU 0 twice in the plan and GPU 1 not at all.
    It is an unreadable decision: the pod is placed on distinct free GPUs of its node,
    like any bound pod without a decision of ours."""
    gang = bound_pod("gang", "a", 0)
    gang["metadata"]["annotations"]["elastico.io/assigned-devices"] = "0,0"
    gang["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "2"},
        "requests": {"nvidia.com/gpu": "2"},
    }
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), gang], "test")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    (job,) = engine.build_snapshot()[0].jobs
    assert sorted(job.devices) == [("a", 0), ("a", 1)]


def test_the_plans_moves_evict_only_pods_that_allow_it_and_a_controller_owns():
    import numpy as np

    from elastico_extender.core.model import Action, Assignment, Plan
    from elastico_extender.core.resources import NUM_RESOURCES

    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1",
              "controller": True}]  # fmt: skip
    pods = {
        name: bound_pod(name, "a", i % 2)
        for i, name in enumerate(["ok", "ok2", "ok3", "optout", "bare"])
    }
    for name in ("ok", "ok2", "ok3", "optout"):
        pods[name]["metadata"]["ownerReferences"] = owner
    for name in ("ok", "ok2", "ok3", "bare"):
        pods[name]["metadata"]["annotations"]["elastico.io/migration"] = "allowed"
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), gpu_node("b", 2, "1"), *pods.values()], "t")
    engine = Engine(ServiceSettings(epoch_seconds=60, max_migrations_per_epoch=1), cluster)
    meta = engine.build_snapshot()[1]
    family = meta["uid-ok"].family

    def moves(*names: str) -> Plan:
        assignments = {
            f"uid-{n}": Assignment(
                f"uid-{n}", 0, family.configs[0], (("b", 0),), 1000.0, 1.0, 1.0, 1.5, Action.MIGRATE
            )
            for n in names
        }
        return Plan(epoch=1, prices=np.zeros(NUM_RESOURCES), assignments=assignments)

    engine.actuator.apply(moves("optout", "bare", "ok", "ok2"), meta, {})
    assert cluster.evictions == [("t", "ok")]  # one per epoch; opted-out and unowned stay
    engine.actuator.apply(moves("ok", "ok2"), meta, {})  # "ok" is already on its way
    assert cluster.evictions == [("t", "ok"), ("t", "ok2")]
    remaining = {p["metadata"]["name"] for p in cluster.state.pods().values()}
    assert remaining == {"ok3", "optout", "bare"}
    off = Engine(ServiceSettings(epoch_seconds=60, max_migrations_per_epoch=0), cluster)
    off.actuator.apply(moves("ok3"), off.build_snapshot()[1], {})
    assert len(cluster.evictions) == 2  # 0: moves are only logged


def test_a_pod_keeps_its_configuration_for_the_dwell_time_after_its_bind():
    """Issue 12 item 6: a reshape restarts the workload, so no epoch reshapes a pod
    during ``min_dwell_seconds`` after its bind; after that the plan may."""
    from test_service_behaviour import elastic_pod
    from test_service_behaviour import gpu_node as full_node

    from elastico_extender.cluster.base import BindRequest

    now = [0.0]
    reshaped: list[str] = []

    class Recording(EmbeddedCluster):
        def reconfigure(self, request: BindRequest) -> None:
            super().reconfigure(request)
            reshaped.append(request.name)

    cluster = Recording([full_node("g0")], "test")
    cluster.add_pod(elastic_pod("bert-a", "bert"))
    engine = Engine(ServiceSettings(epoch_seconds=5, min_dwell_seconds=60), cluster,
                    clock=lambda: now[0])  # fmt: skip
    engine.run_epoch()
    assert engine.bind("ml", "bert-a", "uid-bert-a", "g0") == ""
    cluster.add_pod(elastic_pod("resnet-b", "resnet50"))  # would need bert reshaped
    for t in range(5, 60, 5):
        now[0] = float(t)
        engine.run_epoch()
    assert reshaped == []  # not within the first minute
    now[0] = 65.0
    engine.run_epoch()
    assert reshaped == ["bert-a"]  # once the dwell is over, Case 1 as before


def test_a_running_pod_carries_its_start_time_for_attained_service():
    import time

    from elastico_extender.core.pricing.queueing import service_keys

    running = bound_pod("p0", "a", 0)
    running["status"]["startTime"] = "2026-01-01T00:00:00Z"
    cluster = EmbeddedCluster([gpu_node("a", 2, "1"), running], "test")
    engine = Engine(ServiceSettings(epoch_seconds=60), cluster)
    snapshot = engine.build_snapshot().snapshot
    (job,) = snapshot.jobs
    assert job.started_at == 1767225600.0  # 2026-01-01T00:00:00Z
    assert abs(snapshot.now - time.time()) < 60
    key, _ = service_keys(snapshot)  # one GPU since then: attained GPU-seconds
    assert key[0] == pytest.approx(snapshot.now - 1767225600.0)


def test_a_terminating_pod_holds_its_gpu_until_it_is_gone():
    """A bound pod being deleted (``deletionTimestamp`` set: graceful termination, in
    which elastico-run forwards SIGTERM so the workload can checkpoint) still runs on
    its GPU, as kube-scheduler's cache counts it until the pod is removed.  Before, the
    snapshot dropped it at once, so its GPU looked free and filter offered it to a pod
    that cannot share it.  Now it is counted where it runs, held in its configuration
    and never moved, until the watch shows it deleted.  Through the service, with the
    real client and the fake API server."""
    import httpx
    from test_service_events import pending_pod
    from test_service_observations import gpu_node as node_of
    from test_service_observations import running_pod, start_service, wait_for

    from elastico_extender.cluster.fake_apiserver import FakeApiServer, evicting

    api = FakeApiServer().start()
    api.put("nodes", node_of("g0", 1, memory_mib=40960))  # two berts never share 40 GiB
    api.put("pods", running_pod("a", "g0", 0))
    api.put("pods", pending_pod("b"))
    server, kube, service = start_service(api)

    def passed() -> list[str]:
        body = {"Pod": api.objects["pods"]["ml/b"], "NodeNames": ["g0"]}
        reply = httpx.post(f"{service.url}/scheduler/filter", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply.json()["NodeNames"]

    try:
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        service.epoch()
        assert passed() == []
        api.put("pods", evicting(api.objects["pods"]["ml/a"]))  # deleted, still running
        assert wait_for(
            lambda: (kube.state.pod("uid-a") or {})["metadata"].get("deletionTimestamp")
        )
        for _ in range(2):  # the second epoch reads the same pod object again
            service.epoch()
            assert passed() == []
            job = {j.id: j for j in service.engine.published.snapshot.jobs}["uid-a"]
            assert job.devices == (("g0", 0),) and not job.preemptible
            assert job.allowed == (job.current_config,)
        api.delete("pods", "ml/a")
        assert wait_for(lambda: kube.state.pod("uid-a") is None)
        service.epoch()
        assert passed() == ["g0"]
    finally:
        server.stop()
        api.stop()


def test_a_pod_whose_decision_annotations_were_removed_keeps_the_devices_it_ran_on():
    """A user strips the decision annotations off a running pod (``kubectl annotate
    ... elastico.io/assigned-devices-``).  Its container still runs on the GPU bind chose
    (the environment came from its ConfigMap), so the extender keeps counting it on the
    devices it last counted it on.  Before, it was counted on the lowest free device
    instead, so the GPU it really uses looked idle and the plan put a pod that cannot
    share it there."""
    from test_service_events import pending_pod
    from test_service_observations import gpu_node as node_of
    from test_service_observations import running_pod, start_service, wait_for

    from elastico_extender.cluster.fake_apiserver import FakeApiServer

    api = FakeApiServer().start()
    api.put("nodes", node_of("g0", 2, memory_mib=40960))  # two berts never share 40 GiB
    api.put("pods", running_pod("a", "g0", 1))
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        service.epoch()
        stripped = api.objects["pods"]["ml/a"]
        for key in ("assigned-node", "assigned-devices", "assigned-configuration"):
            del stripped["metadata"]["annotations"][f"elastico.io/{key}"]
        api.put("pods", stripped)
        assert wait_for(
            lambda: (
                "elastico.io/assigned-devices"
                not in (kube.state.pod("uid-a") or {})["metadata"]["annotations"]
            )
        )
        for _ in range(2):
            service.epoch()
            job = {j.id: j for j in service.engine.published.snapshot.jobs}["uid-a"]
            assert job.devices == (("g0", 1),)
        api.put("pods", pending_pod("b"))
        assert wait_for(lambda: kube.state.pod("uid-b") is not None)
        service.epoch()
        plan = service.engine.published.plan
        assert plan.assignments["uid-b"].devices == (("g0", 0),)  # not onto a's GPU
    finally:
        server.stop()
        api.stop()


@pytest.mark.parametrize("strip_configmap_annotation", [False, True])
def test_a_placement_whose_annotations_were_removed_survives_a_restart(
    strip_configmap_annotation,
):
    """Bind puts pod a on GPU 1 of g0 (GPU 0 is taken); pod x on GPU 0 then finishes and a
    user strips a's decision annotations; the extender restarts (a new cluster view and
    service over the same API server).  The container still runs on GPU 1, as its
    ConfigMap (owned by the pod, written by that bind) says: the restarted extender reads
    the placement back from it and counts a there, so a new pod goes to GPU 0.  Before,
    the last placement lived only in the old process's memory: after the restart a was
    counted on the lowest free GPU (0) and the new pod planned onto a's GPU 1, which it
    cannot share.  The ConfigMap is found by the webhook's ``elastico.io/configmap``
    annotation, or, stripped too, by the pod's env that refers to it."""
    import httpx
    from test_service_events import pending_pod
    from test_service_observations import gpu_node as node_of
    from test_service_observations import running_pod, start_service, wait_for

    from elastico_extender.cluster.fake_apiserver import FakeApiServer

    api = FakeApiServer().start()
    api.put("nodes", node_of("g0", 2, memory_mib=40960))  # two berts never share 40 GiB
    api.put("pods", running_pod("x", "g0", 0))
    pod = pending_pod("a")
    cm = "elastico-a-1f2e3d"  # as the webhook names it, and refers to it in the env
    pod["metadata"]["annotations"]["elastico.io/configmap"] = cm
    ref = {"configMapKeyRef": {"name": cm, "key": "ELASTICO_GPU_INDICES"}}
    pod["spec"]["containers"][0]["env"] = [{"name": "ELASTICO_GPU_INDICES", "valueFrom": ref}]
    api.put("pods", pod)
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        service.epoch()
        auth = {"Authorization": f"Bearer {service.token}"}
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        reply = httpx.post(f"{service.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert reply.status_code == 200 and not reply.json().get("Error"), reply.text
        bound = api.objects["pods"]["ml/a"]
        assert bound["metadata"]["annotations"]["elastico.io/assigned-devices"] == "1"
        assert api.configmaps[("ml", cm)]["data"]["ELASTICO_GPU_INDICES"] == "1"
    finally:
        server.stop()
        kube.stop()
    api.delete("pods", "ml/x")  # GPU 0 is free now
    stripped = api.objects["pods"]["ml/a"]
    keep = {"elastico.io/family", "elastico.io/configmap"} - (
        {"elastico.io/configmap"} if strip_configmap_annotation else set()
    )
    notes = stripped["metadata"]["annotations"]
    stripped["metadata"]["annotations"] = {k: v for k, v in notes.items() if k in keep}
    api.put("pods", stripped)
    server, kube, service = start_service(api)  # the restarted extender
    try:
        assert wait_for(lambda: set(kube.state.pods()) == {"uid-a"})
        service.epoch()
        job = {j.id: j for j in service.engine.published.snapshot.jobs}["uid-a"]
        assert job.devices == (("g0", 1),)
        api.put("pods", pending_pod("b"))
        assert wait_for(lambda: kube.state.pod("uid-b") is not None)
        service.epoch()
        plan = service.engine.published.plan
        assert plan.assignments["uid-b"].devices == (("g0", 0),)  # not onto a's GPU
    finally:
        server.stop()
        kube.stop()
        api.stop()
