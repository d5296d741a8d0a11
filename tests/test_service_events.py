"""Decision Events: written as core/v1 Events on the fake API server, rate-limited."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.service.events import (
    EventRecorder,
    PodRef,
    bound_message,
    refused_message,
)


@pytest.fixture
def server():
    srv = FakeApiServer().start()
    yield srv
    srv.stop()


def recorder(server: FakeApiServer, now: list[float], **kw) -> EventRecorder:
    api = client.ApiClient(client.Configuration(host=server.url))
    rec = EventRecorder(api, identity="replica-a", clock=lambda: now[0], **kw)
    rec.start()
    return rec


def events(server: FakeApiServer) -> list[dict]:
    return server.store.items("", "events", "ml")


def test_bound_event_carries_the_decision_in_numbers(server):
    now = [0.0]
    rec = recorder(server, now)
    pod = PodRef("ml", "bert-1", "uid-1")
    text = bound_message("gpu-3", (1,), "batch_size=64,amp=on", 0.4123, 1.081, 1.25)
    assert rec.bound(pod, text)
    rec.flush()
    rec.stop()
    (event,) = events(server)
    assert event["involvedObject"] == {
        "apiVersion": "v1", "kind": "Pod", "name": "bert-1", "namespace": "ml", "uid": "uid-1"
    }  # fmt: skip
    assert event["reason"] == "Bound" and event["type"] == "Normal"
    assert event["message"] == (
        "bound to gpu-3/GPU 1 at batch_size=64,amp=on: price λ=0.412, "
        "predicted slowdown Ŝ=1.08 ≤ τ=1.25"
    )
    assert event["source"]["component"] == "elastico"
    # it parses back into the client's model, as kubectl reads it
    api = client.ApiClient()
    model = api.deserialize(json.dumps(event), "CoreV1Event", "application/json")
    assert model.reason == "Bound"


def test_repeats_inside_the_interval_are_folded_into_the_next_event(server):
    now = [0.0]
    rec = recorder(server, now, min_interval=30.0)
    pod = PodRef("ml", "llama-2")
    assert rec.refused(pod, refused_message("gpu-1", "Ŝ=1.41 > τ=1.25"))
    for _ in range(5):
        now[0] += 1.0
        assert not rec.refused(pod, refused_message("gpu-1", "Ŝ=1.41 > τ=1.25"))
    # another reason for the same pod is not limited by the first
    assert rec.bound(pod, "bound")
    now[0] = 31.0
    assert rec.refused(pod, refused_message("gpu-2", "memory 41 GiB > 40 GiB"))
    rec.flush()
    rec.stop()
    refused = sorted((e["message"] for e in events(server) if e["reason"] == "Refused"), key=len)
    assert len(refused) == 2
    assert refused[1].endswith("(5 similar in the last 30s)")
    assert rec.suppressed == 5


def test_the_queue_and_the_key_memory_are_bounded(server):
    now = [0.0]
    api = client.ApiClient(client.Configuration(host=server.url))
    rec = EventRecorder(api, max_queue=3, max_keys=10, clock=lambda: now[0])  # not started
    results = [rec.bound(PodRef("ml", f"p{i}"), "bound") for i in range(50)]
    assert results.count(True) == 3 and rec.dropped == 47
    assert len(rec._last) == 10


def test_an_api_server_out_of_reach_costs_its_events_not_the_writer(server):
    """No answer at all (connection refused: urllib3's errors, not an ApiException nor an
    OSError): the Events of that moment are lost and logged, the writer lives on and
    writes the next ones once the API server is back, and stop() still returns."""
    api = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # nothing there
    now = [0.0]
    rec = EventRecorder(api, identity="replica-a", clock=lambda: now[0], max_queue=2)
    rec.start()
    assert rec.bound(PodRef("ml", "lost", "uid-0"), "bound while the API server is away")
    deadline = time.monotonic() + 10
    while rec._queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    api.configuration.host = server.url  # back
    for n in range(1, 3):
        assert rec.bound(PodRef("ml", f"bert-{n}", f"uid-{n}"), f"bound {n}")
    deadline = time.monotonic() + 10
    while rec.written < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rec.written == 2
    assert sorted(e["involvedObject"]["name"] for e in events(server)) == ["bert-1", "bert-2"]
    rec.stop(timeout=5)
    assert rec._thread is None


def test_an_event_the_api_server_never_answers_does_not_stall_the_writer(monkeypatch):
    import socket

    from elastico_extender.service import events as events_module

    monkeypatch.setattr(events_module, "WRITE_TIMEOUT_SECONDS", 0.3)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    api = client.ApiClient(client.Configuration(host=f"http://127.0.0.1:{silent.getsockname()[1]}"))
    rec = EventRecorder(api, identity="replica-a", clock=lambda: 0.0)
    rec.start()
    for n in range(2):
        assert rec.bound(PodRef("ml", f"bert-{n}", f"uid-{n}"), f"bound {n}")
    deadline = time.monotonic() + 15
    while rec._queue.unfinished_tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    left = rec._queue.unfinished_tasks
    silent.close()
    rec.stop(timeout=5)
    assert left == 0, "the writer was still waiting for the API server"


def test_rejected_configurations_are_listed_with_reasons_and_capped():
    from elastico_extender.service.events import rejected_configurations_message

    rejected = [(f"batch_size={b}", f"memory {b // 4} GiB > budget 12 GiB") for b in (64, 128)]
    assert rejected_configurations_message(rejected) == (
        "rejected batch_size=64: memory 16 GiB > budget 12 GiB; "
        "batch_size=128: memory 32 GiB > budget 12 GiB"
    )
    many = [(f"c{i}", "Ŝ=1.4 > τ=1.25") for i in range(8)]
    assert rejected_configurations_message(many).endswith("(+3 more)")


def pending_pod(name: str, family: str = "bert") -> dict:
    """A pod the webhook admitted, waiting for ElastiCo to place it."""
    from test_service_observations import running_pod

    pod = running_pod(name, "g0", 0, family=family)
    notes = pod["metadata"]["annotations"]
    for key in ("assigned-node", "assigned-devices", "assigned-configuration"):
        notes.pop(f"elastico.io/{key}")
    del pod["spec"]["nodeName"]
    pod["status"] = {"phase": "Pending"}
    return pod


def test_a_bind_through_the_service_writes_one_bound_event_with_its_numbers():
    """The actuator, on a real (fake-API-server) cluster, tells the pod why it went where
    it went: node/GPU, configuration, λ, Ŝ ≤ τ; a refused bind says why too."""
    import httpx
    from test_service_observations import gpu_node, start_service, wait_for

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("pods", pending_pod("p"))
    server, kube, svc = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        plan = svc.epoch()
        auth = {"Authorization": f"Bearer {svc.token}"}
        bind = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": "g0"}
        reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert reply.status_code == 200 and not reply.json().get("Error"), reply.text
        assert wait_for(lambda: len(events(api)) >= 1)
        (event,) = events(api)
        assert event["reason"] == "Bound" and event["type"] == "Normal"
        assert event["involvedObject"]["uid"] == "uid-p"
        bound = api.objects["pods"]["ml/p"]  # as the Binding left it
        assert bound["spec"]["nodeName"] == "g0"
        notes = bound["metadata"]["annotations"]
        configuration = notes["elastico.io/assigned-configuration"]
        slowdown = float(notes["elastico.io/predicted-slowdown"])
        price = plan["prices"]["gpu_mem_mib"]  # of the plan that bound it
        assert event["message"].startswith(
            f"bound to g0/GPU {notes['elastico.io/assigned-devices']} at {configuration}: "
            f"price λ={price:.3f}, predicted slowdown Ŝ={slowdown:.2f} ≤ τ="
        ), event["message"]
        assert float(event["message"].rsplit("τ=", 1)[1]) > 1.0  # the pod's tolerance
        # a second pod asking for a node that does not exist: one Refused Event
        api.put("pods", pending_pod("q"))
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        for _ in range(3):  # the scheduler retries; the recorder folds the repeats
            bind = {"PodName": "q", "PodNamespace": "ml", "PodUID": "uid-q", "Node": "g9"}
            reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
            assert reply.json().get("Error")
        assert wait_for(lambda: len(events(api)) >= 2)
        time.sleep(0.2)
        refused = [e for e in events(api) if e["reason"] == "Refused"]
        assert len(refused) == 1 and refused[0]["involvedObject"]["name"] == "q"
        assert refused[0]["message"].startswith("refused g9: ")
        # filter with no node that fits: one Refused Event for the pod, not one per node
        api.put("pods", pending_pod("r"))
        assert wait_for(lambda: len(kube.state.pods()) == 3)
        for _ in range(5):  # nodes ElastiCo does not know
            args = {"Pod": api.objects["pods"]["ml/r"], "NodeNames": ["g8", "g9"]}
            reply = httpx.post(f"{svc.url}/scheduler/filter", json=args, timeout=30)
            assert reply.json()["NodeNames"] == [], reply.text
        assert wait_for(lambda: len(events(api)) >= 3)
        time.sleep(0.2)
        (nowhere,) = [e for e in events(api) if e["involvedObject"]["name"] == "r"]
        assert nowhere["reason"] == "Refused"
        assert nowhere["message"].startswith("refused all 2 nodes offered: elastico: ")
    finally:
        server.stop()
        api.stop()


def test_filter_writes_events_only_about_pods_of_the_cluster():
    """The filter body is the caller's word: a pod it names that the cluster view does not
    hold (or whose UID is another pod's) gets no Warning Event, so a caller cannot put
    Events on pods of its choosing; the same pod, once in the view, gets its one Event."""
    import httpx
    from test_service_observations import gpu_node, start_service, wait_for

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    server, kube, svc = start_service(api)
    try:
        svc.epoch()
        ghost = pending_pod("ghost")  # never created on the API server
        victim = pending_pod("victim")
        victim["metadata"]["uid"] = "uid-other"  # a real pod's name with another UID
        api.put("pods", pending_pod("victim"))
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        for pod in (ghost, victim):
            args = {"Pod": pod, "NodeNames": ["g8", "g9"]}
            reply = httpx.post(f"{svc.url}/scheduler/filter", json=args, timeout=30)
            assert reply.json()["NodeNames"] == [], reply.text
        args = {"Pod": api.objects["pods"]["ml/victim"], "NodeNames": ["g8", "g9"]}
        reply = httpx.post(f"{svc.url}/scheduler/filter", json=args, timeout=30)
        assert reply.json()["NodeNames"] == [], reply.text
        assert wait_for(lambda: len(events(api)) >= 1)
        time.sleep(0.3)  # the writer thread has had time to write any other
        (event,) = events(api)
        assert event["involvedObject"]["name"] == "victim"
        assert event["involvedObject"]["uid"] == "uid-victim"
    finally:
        server.stop()
        api.stop()


def test_an_in_place_reconfiguration_writes_a_reconfigured_event():
    """Spec 5.3 Case 1 on the fake API server: BERT alone on a 40 GB GPU, then ResNet-50
    arrives; the epoch reshapes BERT and the pod is told from what to what and why."""
    import httpx
    from test_service_observations import gpu_node, start_service, wait_for

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1, memory_mib=40960))
    api.put("pods", pending_pod("a", "bert"))
    server, kube, svc = start_service(api, min_dwell_seconds=0)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        svc.epoch()
        auth = {"Authorization": f"Bearer {svc.token}"}
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert not reply.json().get("Error"), reply.text
        before = api.objects["pods"]["ml/a"]["metadata"]["annotations"]
        assert wait_for(lambda: (kube.state.pod("uid-a") or {}).get("spec", {}).get("nodeName"))
        api.put("pods", pending_pod("b", "resnet50"))
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        plan = svc.epoch()
        assert wait_for(lambda: any(e["reason"] == "Reconfigured" for e in events(api)))
        (event,) = [e for e in events(api) if e["reason"] == "Reconfigured"]
        after = api.objects["pods"]["ml/a"]["metadata"]["annotations"]
        old, new = (before["elastico.io/assigned-configuration"],
                    after["elastico.io/assigned-configuration"])  # fmt: skip
        assert old != new
        price = plan["prices"]["gpu_mem_mib"]
        assert event["message"].startswith(
            f"{old} -> {new} because the plan of epoch {plan['epoch']} reshapes it at GPU "
            f"memory price λ={price:.3f}: memory budget "
        ), event["message"]
        assert f"-> {after['elastico.io/memory-budget-mib']} MiB" in event["message"]
    finally:
        server.stop()
        api.stop()


def test_no_recorder_without_a_real_cluster():
    from elastico_extender.api.app import create_app
    from elastico_extender.cluster.embedded import EmbeddedCluster
    from elastico_extender.service.settings import ServiceSettings

    app = create_app(ServiceSettings(epoch_seconds=3600), EmbeddedCluster.from_file())
    assert app.state.engine.actuator.events is None


@pytest.fixture
def rejected_pod() -> Iterator[Callable[..., tuple[FakeApiServer, Any, Any]]]:
    """Start a service on a fake API server with ``nodes`` and one pending bert pod ``p``,
    run three epochs and check the plan rejects ``p``; returns (api, kube view, service).
    The recorder's rate limit is off, so only the actuator's memory of what it said
    keeps a pod from being told twice."""
    from test_service_observations import start_service, wait_for

    started: list[tuple[Any, FakeApiServer]] = []

    def start(*nodes: dict) -> tuple[FakeApiServer, Any, Any]:
        api = FakeApiServer().start()
        for node in nodes:
            api.put("nodes", node)
        api.put("pods", pending_pod("p"))
        server, kube, svc = start_service(api)
        started.append((server, api))
        svc.app.state.engine.actuator.events.min_interval = 0.0
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        for _ in range(3):
            svc.epoch()
        assert "uid-p" in svc.app.state.engine.published.plan.rejected
        return api, kube, svc

    yield start
    for server, api in started:
        server.stop()
        api.stop()


def test_a_pod_whose_configurations_are_all_rejected_is_told_once(rejected_pod):
    """A pending pod no configuration of which fits any GPU stays queued: one
    ``ConfigurationsRejected`` Event says why, not one per epoch."""
    from test_service_observations import gpu_node, wait_for

    api, kube, svc = rejected_pod(gpu_node("g0", 1, memory_mib=1024))  # smaller than any bert row
    assert wait_for(lambda: any(e["reason"] == "ConfigurationsRejected" for e in events(api)))
    time.sleep(0.3)
    found = [e for e in events(api) if e["reason"] == "ConfigurationsRejected"]
    assert len(found) == 1, [e["message"] for e in found]
    (event,) = found
    assert event["involvedObject"]["name"] == "p" and event["involvedObject"]["uid"] == "uid-p"
    assert event["type"] == "Warning"
    assert event["message"].startswith("rejected all ")
    assert "no allowed configuration fits any GPU" in event["message"], event["message"]
    # a node that fits: the pod is no longer rejected; no further Event about it
    api.put("nodes", gpu_node("g1", 1))
    assert wait_for(lambda: len(kube.state.nodes()) == 2)
    svc.epoch()
    assert "uid-p" not in svc.app.state.engine.published.plan.rejected


def test_a_view_without_nodes_tells_a_pending_pod_nothing(rejected_pod):
    """At startup the pods may be listed before the nodes: a plan on that view rejects
    every pod ("the cluster has no GPU devices"), which says nothing about the pod."""
    api, _, _ = rejected_pod()
    time.sleep(0.3)
    assert not [e for e in events(api) if e["reason"] == "ConfigurationsRejected"]


def test_a_shrink_the_api_server_refuses_frees_no_memory_in_the_view():
    """The epoch writes a reconfiguration that shrinks a running pod's budget before it
    publishes the view that counts the memory freed.  When the API server refuses that
    write (503: etcd away; 429 would do the same), the pod keeps its old decision and
    its workload keeps its memory: the view must still count it so.  Before, the view
    was published with the plan's smaller budget all the same, and filter offered the
    'freed' memory to the pod the shrink was for; now the pod is counted where and as
    it runs, and the shrink is made, and the memory offered, once a write goes
    through."""
    import httpx
    from test_service_observations import gpu_node, start_service, wait_for

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1, memory_mib=40960))
    api.put("pods", pending_pod("a", "bert"))
    server, kube, svc = start_service(api, min_dwell_seconds=0)

    def passed(name: str) -> list[str]:
        body = {"Pod": api.objects["pods"][f"ml/{name}"], "NodeNames": ["g0"]}
        reply = httpx.post(f"{svc.url}/scheduler/filter", json=body, timeout=30)
        assert reply.status_code == 200, reply.text
        return reply.json()["NodeNames"]

    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        svc.epoch()
        auth = {"Authorization": f"Bearer {svc.token}"}
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        reply = httpx.post(f"{svc.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert not reply.json().get("Error"), reply.text
        before = dict(api.objects["pods"]["ml/a"]["metadata"]["annotations"])
        assert wait_for(lambda: (kube.state.pod("uid-a") or {}).get("spec", {}).get("nodeName"))
        unavailable = (503, {"kind": "Status", "code": 503, "reason": "ServiceUnavailable",
                             "message": "etcdserver: request timed out"})  # fmt: skip
        api.write_fault = lambda method, path: (
            unavailable if method == "PATCH" and path.endswith("/pods/a") else None
        )
        api.put("pods", pending_pod("b", "resnet50"))
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        svc.epoch()
        assert api.objects["pods"]["ml/a"]["metadata"]["annotations"] == before
        assert passed("b") == []  # a still holds its peak budget
        api.write_fault = None
        svc.epoch()
        after = api.objects["pods"]["ml/a"]["metadata"]["annotations"]
        assert after["elastico.io/memory-budget-mib"] != before["elastico.io/memory-budget-mib"]
        assert passed("b") == ["g0"]
    finally:
        server.stop()
        api.stop()
