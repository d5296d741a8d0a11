"""The extender verbs against the published plan, as kube-scheduler really calls them
(real HTTP through uvicorn): idle GPUs before sharing, the plan's node first, binds to
nodes the plan did not choose, concurrent binds for the last GPUs, and the reply shapes."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from test_service_behaviour import args, call, elastic_pod, gpu_node, start

from elastico_extender.cluster.embedded import EmbeddedCluster


def running(name: str, family: str, node: str) -> dict:
    pod = elastic_pod(name, family)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return pod


@pytest.fixture
def shared_and_idle() -> Iterator[tuple[str, str, EmbeddedCluster]]:
    """g0's one GPU runs resnet50 (room for an lstm next to it); g1's GPU is idle."""
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1")], "test")
    cluster.add_pod(running("a", "resnet50", "g0"))
    server, token = start(cluster)
    yield server.url, token, cluster
    server.stop()


def test_filter_never_shares_a_gpu_while_an_offered_node_has_an_idle_one_that_fits(
    shared_and_idle,
):
    url, _, cluster = shared_and_idle
    newcomer = elastic_pod("y", "lstm")  # arrives after the plan: answered on the spot
    cluster.add_pod(newcomer)
    alone = call(url, "filter", args(newcomer, ["g0"])).json()
    assert alone["NodeNames"] == ["g0"]  # sharing is fine when nothing idle is offered
    body = call(url, "filter", args(newcomer, ["g0", "g1"])).json()
    assert body["NodeNames"] == ["g1"]
    assert "idle GPU" in body["FailedNodes"]["g0"]
    assert body["FailedAndUnresolvableNodes"] == {}
    # the reason names no node, so a reordered node list gives the same message
    again = call(url, "filter", args(newcomer, ["g1", "g0"])).json()
    assert again["FailedNodes"] == body["FailedNodes"]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'elastico_rejections_total{reason="idle-elsewhere"}' in metrics
