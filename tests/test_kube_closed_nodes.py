"""Cordoned and tainted nodes, as kube-scheduler treats them, for pending pods.

kube-scheduler never binds a pod to a node with ``spec.unschedulable`` (NodeUnschedulable)
or with a NoSchedule/NoExecute taint the pod does not tolerate (TaintToleration).  The plan
must not reserve GPUs there for a pending pod: the reservation is one the pod can never
take, and it may keep the pod pending while an open node fits.  Pods already running on a
node that is cordoned later stay where they are (a cordon evicts nothing).  Through the
service, with the real kubernetes client against the fake API server.
"""

from __future__ import annotations

import copy

import httpx
import pytest
from test_service_events import pending_pod
from test_service_observations import gpu_node, running_pod, start_service, wait_for

from elastico_extender.cluster.fake_apiserver import FakeApiServer


def cordoned(node: dict) -> dict:
    node = copy.deepcopy(node)
    node["spec"]["unschedulable"] = True
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]
    return node


def tainted(node: dict, effect: str = "NoSchedule") -> dict:
    node = copy.deepcopy(node)
    node["spec"]["taints"] = [{"key": "dedicated", "value": "infer", "effect": effect}]
    return node


def filtered(service, pod: dict, names: list[str]) -> dict:
    body = {"Pod": pod, "NodeNames": names}
    reply = httpx.post(f"{service.url}/scheduler/filter", json=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("close", [cordoned, tainted, lambda n: tainted(n, "NoExecute")])
def test_a_pending_pod_is_planned_only_on_a_node_open_to_it(close):
    """g0 (1 GPU, best fit: the planner's first choice) is closed; g1 (4 GPUs) is open.
    Before, the plan put the pending pod on g0, reserving a GPU kube-scheduler would never
    let it have, and filter passed g0.  Now the plan puts it on g1, and filter refuses g0
    naming why, as unresolvable (no preemption opens a cordoned node)."""
    api = FakeApiServer().start()
    api.put("nodes", close(gpu_node("g0", 1)))
    api.put("nodes", gpu_node("g1", 4))
    api.put("pods", pending_pod("p"))
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        service.epoch()
        plan = service.engine.published.plan
        assert plan.assignments["uid-p"].devices[0][0] == "g1"
        answer = filtered(service, api.objects["pods"]["ml/p"], ["g0", "g1"])
        assert answer["NodeNames"] == ["g1"]
        reason = answer["FailedAndUnresolvableNodes"]["g0"]
        assert "g0" in reason and ("cordoned" in reason or "taint" in reason), reason
    finally:
        server.stop()
        api.stop()


def test_a_pending_pod_waits_rather_than_be_planned_onto_a_closed_node():
    """The only GPU node is cordoned: the pod is not planned at all (it waits, saying why),
    and a pod that tolerates the taint is planned there, as kube-scheduler would bind it."""
    api = FakeApiServer().start()
    api.put("nodes", tainted(gpu_node("g0", 2)))
    api.put("pods", pending_pod("p"))
    tolerant = pending_pod("t")
    tolerant["spec"]["tolerations"] = [
        {"key": "dedicated", "operator": "Equal", "value": "infer", "effect": "NoSchedule"}
    ]
    api.put("pods", tolerant)
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 2)
        service.epoch()
        plan = service.engine.published.plan
        assert "uid-p" not in plan.assignments
        assert "taint" in plan.queue_reasons["uid-p"] or "closed" in plan.queue_reasons["uid-p"]
        assert plan.assignments["uid-t"].devices[0][0] == "g0"
        assert filtered(service, tolerant, ["g0"])["NodeNames"] == ["g0"]
        # and bind, should a scheduler ask, refuses the closed node for the pod
        auth = {"Authorization": f"Bearer {service.token}"}
        bind = {"PodName": "p", "PodNamespace": "ml", "PodUID": "uid-p", "Node": "g0"}
        reply = httpx.post(f"{service.url}/scheduler/bind", json=bind, headers=auth, timeout=30)
        assert "taint" in reply.json().get("Error", ""), reply.text
        assert api.bindings == []
    finally:
        server.stop()
        api.stop()


def test_a_running_pod_on_a_node_cordoned_later_stays_where_it_runs():
    """A cordon evicts nothing: the running pod keeps its GPU in the plan (it is neither
    moved nor requeued), and a new pending pod goes to the open node."""
    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0", 1))
    api.put("nodes", gpu_node("g1", 1))
    api.put("pods", running_pod("a", "g0", 0))
    server, kube, service = start_service(api)
    try:
        assert wait_for(lambda: len(kube.state.pods()) == 1)
        service.epoch()
        api.put("nodes", cordoned(api.objects["nodes"]["g0"]))
        assert wait_for(lambda: (kube.state.node("g0") or {})["spec"].get("unschedulable"))
        api.put("pods", pending_pod("b"))
        assert wait_for(lambda: kube.state.pod("uid-b") is not None)
        service.epoch()
        plan = service.engine.published.plan
        job = {j.id: j for j in service.engine.published.snapshot.jobs}["uid-a"]
        assert job.devices == (("g0", 0),)
        assert plan.assignments["uid-a"].devices == (("g0", 0),)
        assert plan.assignments["uid-b"].devices == (("g1", 0),)
    finally:
        server.stop()
        api.stop()


def test_the_core_places_a_job_on_no_barred_node_and_keeps_a_running_one_there():
    """The core, pure: ``Job.barred_nodes`` leaves those nodes out when the job is placed
    afresh (single GPUs and gangs), a job barred from every node with room waits saying
    why, and a running job keeps its devices on a node barred to it."""
    from conftest import a100_nodes

    from elastico_extender.core.model import Job, Snapshot
    from elastico_extender.core.planner import plan
    from elastico_extender.core.shapes.catalog import catalog_families

    families = {"bert": catalog_families()["bert"]}
    nodes = a100_nodes(3, gpus_per_node=2)
    fastest = families["bert"].fastest_index
    jobs = (
        Job("one", "bert", barred_nodes=frozenset({"node-0"})),
        Job("gang", "bert", gpus=2, barred_nodes=frozenset({"node-0", "node-1"})),
        Job("nowhere", "bert", barred_nodes=frozenset({"node-0", "node-1", "node-2"})),
        Job("stays", "bert", current_config=fastest, devices=(("node-0", 0),),
            barred_nodes=frozenset({"node-0"})),
    )  # fmt: skip
    result = plan(Snapshot(nodes, jobs, families))
    placed = result.assignments
    assert {node for node, _ in placed["one"].devices} == {"node-1"}
    assert {node for node, _ in placed["gang"].devices} == {"node-2"}
    assert "nowhere" not in placed and "barred" in result.queue_reasons["nowhere"]
    assert placed["stays"].devices == (("node-0", 0),)


def test_closed_nodes_are_kept_per_toleration_list_through_heartbeats():
    """A status heartbeat (a new node object, same cordon and taints) keeps the answers;
    a cordon, an uncordon or a new taint changes them."""
    from elastico_extender.cluster.state import ClusterState
    from elastico_extender.service.closures import Closures

    state = ClusterState()
    state.replace("nodes", [tainted(gpu_node("g0", 1)), gpu_node("g1", 1)], "1")
    closures = Closures(state)
    pod = pending_pod("p")
    first = closures.closed(pod)
    assert set(first) == {"g0"} and "dedicated=infer:NoSchedule" in first["g0"]
    beat = copy.deepcopy(state.node("g0"))
    beat["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    state.apply("nodes", "MODIFIED", beat)
    assert closures.closed(pod) is first
    state.apply("nodes", "MODIFIED", cordoned(gpu_node("g1", 1)))
    assert set(closures.closed(pod)) == {"g0", "g1"}
    tolerant = copy.deepcopy(pod)
    tolerant["spec"]["tolerations"] = [{"operator": "Exists"}]  # tolerates every taint
    assert closures.closed(tolerant) == {}
    state.apply("nodes", "MODIFIED", gpu_node("g1", 1))
    assert set(closures.closed(pod)) == {"g0"}
