"""Every write to the API server names ElastiCo (issue 12, item 16).

The fake API server derives each write's field manager as a real one does: the
``fieldManager`` query parameter, else the User-Agent's product name; a write by
the stock client would show up as ``OpenAPI-Generator`` in managedFields.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kubernetes import client

from elastico_extender import __version__
from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import FIELD_MANAGER, KubeCluster


def pod(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "main"}]}, "status": {"phase": "Pending"}}  # fmt: skip


@pytest.fixture
def kube() -> Iterator[tuple[FakeApiServer, KubeCluster]]:
    server = FakeApiServer().start()
    server.put("nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-0"},
                         "status": {"allocatable": {"nvidia.com/gpu": "1"}}})  # fmt: skip
    for name in ("a", "b"):
        server.put("pods", pod(name))
    cluster = KubeCluster(client.ApiClient(client.Configuration(host=server.url)))
    cluster.start()
    assert cluster.wait_synced(15)
    yield server, cluster
    cluster.stop()
    server.stop()


def test_every_write_names_elastico_as_field_manager_and_user_agent(kube):
    server, cluster = kube
    request = BindRequest("ml", "a", "uid-a", "gpu-0", {"elastico.io/assigned-devices": "0"},
                          "elastico-a", {"CUDA_VISIBLE_DEVICES": "0"})  # fmt: skip
    cluster.bind(request)
    cluster.reconfigure(BindRequest("ml", "a", "uid-a", "gpu-0", {"elastico.io/sm-share": "1"},
                                    "elastico-a", {"CUDA_VISIBLE_DEVICES": "0"}))  # fmt: skip
    cluster.evict("ml", "b", "uid-b")
    writes = [w for w in server.writes if w["method"] != "GET"]
    assert {w["method"] + " " + w["kind"] for w in writes} >= {
        "POST configmaps", "PUT configmaps", "PATCH pods", "POST binding", "POST eviction"
    }  # fmt: skip
    for write in writes:
        assert write["manager"] == FIELD_MANAGER == "elastico-extender", write
        assert write["user_agent"].startswith(f"elastico-extender/{__version__}"), write
    managers = {m["manager"] for m in server.objects["pods"]["ml/a"]["metadata"]["managedFields"]}
    assert managers == {"elastico-extender"}
    cm = server.configmaps[("ml", "elastico-a")]
    assert {m["manager"] for m in cm["metadata"]["managedFields"]} == {"elastico-extender"}
