"""A node's GPU count as kube-scheduler and the kubelet see it: allocatable before labels.

NVIDIA GPU feature discovery's ``nvidia.com/gpu.count`` label says how many GPUs the node
has; ``status.allocatable["nvidia.com/gpu"]`` says how many the device plugin offers pods
now (the kubelet refuses a pod asking for more at admission).  A device plugin that found
no healthy GPU, or a node being drained of them, advertises 0 while the label still says
the hardware is there.
"""

from __future__ import annotations

import pytest

from elastico_extender.cluster.objects import node_from_json


def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict:
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", **allocatable}
    capacity = {**alloc, "nvidia.com/gpu": labels.get("nvidia.com/gpu.count", "0")}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.memory": "40960", **labels}},
            "spec": {}, "status": {"allocatable": alloc, "capacity": capacity}}  # fmt: skip


@pytest.mark.parametrize(
    ("labels", "allocatable", "gpus"),
    [
        # the device plugin offers none (no healthy GPU, or drained): none, whatever GFD says
        ({"nvidia.com/gpu.count": "4"}, {"nvidia.com/gpu": "0"}, 0),
        # two GPUs unhealthy: the two the plugin still offers
        ({"nvidia.com/gpu.count": "4"}, {"nvidia.com/gpu": "2"}, 2),
        # mode A (no device plugin resource): the label is all there is
        ({"nvidia.com/gpu.count": "4"}, {}, 4),
        # no label: allocatable, as before
        ({}, {"nvidia.com/gpu": "8"}, 8),
        # time-slicing: each GPU advertised ``replicas`` times (GFD's nvidia.com/gpu.replicas)
        ({"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4"},
         {"nvidia.com/gpu": "8"}, 2),
        ({"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4"},
         {"nvidia.com/gpu": "4"}, 1),  # one GPU's replicas unhealthy
    ],
)  # fmt: skip
def test_allocatable_gpus_win_over_the_gpu_count_label(labels, allocatable, gpus):
    parsed = node_from_json(node("n", labels, allocatable), default_gpu_memory_mib=40960)
    assert len(parsed.gpus) == gpus


def test_a_node_whose_device_plugin_offers_no_gpu_gets_no_gpu_pod():
    """Through the service, with the real client against the fake API server: node g0's
    label says 2 GPUs, its device plugin offers 0.  Before, the label won: the plan put the
    pending pod on g0 (best fit: the node with the fewest idle GPUs) and filter passed g0,
    where the kubelet would refuse the pod at admission.  Now g0 has no GPU for the plan,
    the pod goes to g1, and filter refuses g0."""
    import httpx
    from test_service_events import pending_pod
    from test_service_observations import start_service, wait_for

    from elastico_extender.cluster.fake_apiserver import FakeApiServer

    api = FakeApiServer().start()
    api.put("nodes", node("g0", {"nvidia.com/gpu.count": "2"}, {"nvidia.com/gpu": "0"}))
    api.put("nodes", node("g1", {"nvidia.com/gpu.count": "4"}, {"nvidia.com/gpu": "4"}))
    api.put("pods", pending_pod("p"))
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        service.epoch()
        snapshot = service.engine.published.snapshot
        assert {n.name: len(n.gpus) for n in snapshot.nodes} == {"g0": 0, "g1": 4}
        assert service.engine.published.plan.assignments["uid-p"].devices[0][0] == "g1"
        body = {"Pod": api.objects["pods"]["ml/p"], "NodeNames": ["g0", "g1"]}
        reply = httpx.post(f"{service.url}/scheduler/filter", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["NodeNames"] == ["g1"]
    finally:
        server.stop()
        api.stop()
