"""Every extender verb over real HTTP (uvicorn on 127.0.0.1) with the captured wire bodies."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

WIRE = Path(__file__).resolve().parents[1] / ".." / "shared" / "wire"
if not WIRE.exists():
    WIRE = Path("/work/shared/wire")
pytestmark = pytest.mark.skipif(not WIRE.exists(), reason="wire captures not available")


def load(name: str) -> dict:
    return json.loads((WIRE / name).read_text())


def wire_cluster() -> EmbeddedCluster:
    body = load("filter.json")
    nodes = [dict(n, kind="Node", apiVersion="v1") for n in body["Nodes"]["items"]]
    cluster = EmbeddedCluster(copy.deepcopy(nodes), "wire")
    for line in (WIRE / "requests.jsonl").read_text().splitlines():
        req = json.loads(line)
        if req["verb"] == "filter":
            cluster.add_pod(dict(req["body"]["Pod"], kind="Pod"))
    return cluster


@pytest.fixture
def service() -> Iterator[tuple[str, str, EmbeddedCluster]]:
    cluster = wire_cluster()
    app = create_app(ServiceSettings(epoch_seconds=60), cluster)
    with ServerThread(app) as server:
        yield server.url, app.state.token, cluster


def post(url: str, verb: str, body: bytes | dict, token: str | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(f"{url}/scheduler/{verb}", content=content, headers=headers, timeout=30)


def test_filter_with_node_cache_off_answers_in_nodes(service):
    url, _, _ = service
    reply = post(url, "filter", (WIRE / "filter.json").read_bytes())
    assert reply.status_code == 200
    body = reply.json()
    assert set(body) >= {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["gpu-node-2", "gpu-node-3"]
    # echoed node objects are the scheduler's own, unchanged
    sent = {n["metadata"]["name"]: n for n in load("filter.json")["Nodes"]["items"]}
    assert body["Nodes"]["items"][0] == sent["gpu-node-2"]
    failed = {**body["FailedNodes"], **body["FailedAndUnresolvableNodes"]}
    assert set(failed) == {"gpu-node-1"}
    assert "needs 2" in failed["gpu-node-1"]
    assert body["Error"] == ""


def test_filter_with_node_cache_on_answers_in_node_names(service):
    url, _, _ = service
    body = post(url, "filter", (WIRE / "nodecache" / "filter.json").read_bytes()).json()
    assert "Nodes" not in body
    assert sorted(body["NodeNames"]) == ["gpu-node-2", "gpu-node-3"]
    assert "gpu-node-1" in body["FailedAndUnresolvableNodes"]


def test_prioritize_scores_each_candidate_in_range(service):
    url, _, _ = service
    for name in ("prioritize.json", "nodecache/prioritize.json"):
        reply = post(url, "prioritize", (WIRE / name).read_bytes())
        assert reply.status_code == 200
        scores = reply.json()
        assert [s["Host"] for s in scores] == ["gpu-node-2", "gpu-node-3"]
        assert all(isinstance(s["Score"], int) and 0 <= s["Score"] <= 10 for s in scores)


def test_bind_needs_auth_then_binds_through_the_cluster(service):
    url, token, cluster = service
    args = (WIRE / "bind.json").read_bytes()
    assert post(url, "bind", args).status_code == 401
    reply = post(url, "bind", args, token)
    assert reply.status_code == 200 and reply.json() == {"Error": ""}
    pod = cluster.state.pod_by_name("default", "gpu-pod-a")
    assert pod is not None and pod["spec"]["nodeName"] == "gpu-node-3"
    assert cluster.bindings[-1]["target"]["name"] == "gpu-node-3"
    # a retried bind (same pod, same node) succeeds; one to another node is refused
    assert post(url, "bind", args, token).json() == {"Error": ""}
    elsewhere = json.loads(args)
    elsewhere["Node"] = "gpu-node-2"
    assert "already bound to gpu-node-3" in post(url, "bind", elsewhere, token).json()["Error"]
    assert len(cluster.bindings) == 1


def test_bind_whose_uid_and_name_are_two_pods_binds_neither(service):
    """kube-scheduler takes PodName, PodNamespace and PodUID from one pod; a body whose
    UID is gpu-pod-a's but whose name is gpu-pod-b's is not a bind of gpu-pod-a."""
    url, token, cluster = service
    args = json.loads((WIRE / "bind.json").read_text())
    assert cluster.state.pod_by_name("default", "gpu-pod-b") is not None
    for namespace, name in (("default", "gpu-pod-b"), ("default", "nobody"), ("ml", "gpu-pod-a")):
        mixed = dict(args, PodNamespace=namespace, PodName=name)
        reply = post(url, "bind", mixed, token)
        assert reply.status_code == 200 and "not known to ElastiCo" in reply.json()["Error"]
    assert cluster.bindings == []
    for pod in cluster.state.pods().values():
        assert not pod["spec"].get("nodeName")
    assert post(url, "bind", args, token).json() == {"Error": ""}  # the consistent body binds


def test_two_gpu_pod_then_one_gpu_pod_follow_the_capacity(service):
    url, token, cluster = service
    lines = [json.loads(x) for x in (WIRE / "requests.jsonl").read_text().splitlines()]
    for req in lines:
        reply = post(url, req["verb"], req["body"], token)
        assert reply.status_code == 200, reply.text
        if req["verb"] == "filter":
            got = sorted(n["metadata"]["name"] for n in reply.json()["Nodes"]["items"])
            want = sorted(n["metadata"]["name"] for n in req["reply"]["Nodes"]["items"])
            assert got == want
        if req["verb"] == "bind":
            assert reply.json() == {"Error": ""}
    bound = {
        p["metadata"]["name"]: p["spec"].get("nodeName") for p in cluster.state.pods().values()
    }
    assert bound == {"gpu-pod-a": "gpu-node-3", "gpu-pod-b": "gpu-node-3"}


def test_every_captured_request_parses_and_gets_an_answer(service):
    url, token, _ = service
    for name in ("nodecache/requests.jsonl", "preempt/requests.jsonl"):
        for line in (WIRE / name).read_text().splitlines():
            req = json.loads(line)
            if req["verb"] == "bind":
                continue  # those pods are not in this cluster
            reply = post(url, req["verb"], req["body"], token)
            assert reply.status_code == 200, (req["verb"], reply.text)
            body = reply.json()
            if req["verb"] == "filter":
                assert body["Error"] == ""
                names = req["body"]["NodeNames"] or [
                    n["metadata"]["name"] for n in req["body"]["Nodes"]["items"]
                ]
                answered = (
                    set(body["NodeNames"])
                    | set(body["FailedNodes"])
                    | set(body["FailedAndUnresolvableNodes"])
                )
                assert answered == set(names)
            if req["verb"] == "preempt":
                assert "NodeNameToMetaVictims" in body


def test_preempt_keeps_only_victims_running_on_that_node(service):
    url, _, cluster = service
    args = load("preempt/preempt.json")
    # none of the captured victims run in this cluster: nothing may be claimed
    assert post(url, "preempt", args).json() == {"NodeNameToMetaVictims": {}}
    victim = cluster.add_pod({"metadata": {"name": "low", "namespace": "default",
                                           "uid": "victim-1"},
                              "spec": {"nodeName": "gpu-node-2", "containers": []},
                              "status": {"phase": "Running"}})  # fmt: skip
    args["NodeNameToMetaVictims"] = {
        "gpu-node-2": {"Pods": [{"UID": victim["metadata"]["uid"]}], "NumPDBViolations": 0},
        "gpu-node-3": {"Pods": [{"UID": "not-there"}], "NumPDBViolations": 0},
    }
    body = post(url, "preempt", args).json()
    assert body == {
        "NodeNameToMetaVictims": {
            "gpu-node-2": {"Pods": [{"UID": "victim-1"}], "NumPDBViolations": 0}
        }
    }
    full = load("preempt/preempt.nodecache-false.json")
    reply = post(url, "preempt", full)
    assert reply.status_code == 200 and "NodeNameToMetaVictims" in reply.json()
