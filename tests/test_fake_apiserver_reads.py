"""Single-object reads on the project's fake API server, through the real kubernetes
client: ``read_namespaced_pod`` and ``read_node`` get the object, or a 404 Status."""

from __future__ import annotations

import json
import socket
import struct
import time
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


def test_a_client_resetting_its_connection_prints_no_traceback(
    core: tuple[FakeApiServer, client.CoreV1Api], capfd: pytest.CaptureFixture[str]
) -> None:
    """Clients hang up all the time (a dropped watch, a closed pool): the fake API server
    treats a reset as routine, as a real one does, instead of a traceback on stderr that
    reads like a failure in the test output.  The server keeps answering afterwards."""
    api, v1 = core
    host, port = api.httpd.server_address[:2]
    for _ in range(3):
        sock = socket.create_connection((host, port))
        sock.sendall(b"GET /api/v1/nodes HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.05)  # the answer arrives; the server waits for the next request
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # linger 0: a reset, not a clean close
    time.sleep(0.2)
    assert v1.read_namespaced_pod("a", "ml").metadata.name == "a"
    assert "Exception occurred" not in capfd.readouterr().err
