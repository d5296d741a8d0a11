"""The service's snapshot keeps one nodes tuple while the cluster is unchanged.

The core memoises its per-cluster device index by the identity of that tuple,
so a heartbeat (a new resourceVersion, same node) must not rebuild it, and a
real change must.
"""

from __future__ import annotations

import copy

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
