"""Single-object reads on the project's fake API server, through the real kubernetes
client: ``read_namespaced_pod`` and ``read_node`` get the object, or a 404 Status."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_service_observations import gpu_node, running_pod

from elastico_extender.cluster.fake_apiserver import FakeApiServer


@pytest.fixture
def core() -> Iterator[tuple[FakeApiServer, client.CoreV1Api]]:
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 2))
    api.put("pods", running_pod("a", "g0", 0))
    yield api, client.CoreV1Api(client.ApiClient(client.Configuration(host=api.url)))
    api.stop()


def test_read_namespaced_pod_returns_the_pod(core: tuple[FakeApiServer, client.CoreV1Api]) -> None:
    api, v1 = core
    pod = v1.read_namespaced_pod("a", "ml")
    assert pod.kind == "Pod" and pod.api_version == "v1"
    assert pod.metadata.name == "a" and pod.metadata.uid == "uid-a"
    assert pod.spec.node_name == "g0"
    assert (
        pod.metadata.resource_version == api.objects["pods"]["ml/a"]["metadata"]["resourceVersion"]
    )


def test_a_missing_pod_is_a_404_status(core: tuple[FakeApiServer, client.CoreV1Api]) -> None:
    _, v1 = core
    with pytest.raises(ApiException) as info:
        v1.read_namespaced_pod("nope", "ml")
    assert info.value.status == 404
    status = json.loads(info.value.body)
    assert status["kind"] == "Status" and status["reason"] == "NotFound"
    assert status["details"] == {"name": "nope", "kind": "pods"}
    with pytest.raises(ApiException) as other_ns:
        v1.read_namespaced_pod("a", "elsewhere")
    assert other_ns.value.status == 404


def test_read_node_returns_the_node_or_a_404(core: tuple[FakeApiServer, client.CoreV1Api]) -> None:
    _, v1 = core
    node = v1.read_node("g0")
    assert node.kind == "Node" and node.metadata.name == "g0"
    with pytest.raises(ApiException) as info:
        v1.read_node("g9")
    assert info.value.status == 404
    assert json.loads(info.value.body)["reason"] == "NotFound"
