"""Per-pod placement between epochs: the view the extender's verbs read."""

from __future__ import annotations

from conftest import a100_nodes

from elastico_extender.core.model import Job, JobKind, Snapshot
from elastico_extender.core.planner import PlacementView, plan


def test_two_pods_never_get_the_same_gpu_memory(families):
    nodes = a100_nodes(1, 1)
    view = PlacementView(Snapshot(nodes, (), families), plan(Snapshot(nodes, (), families)))
    llama = families["llama3-7b"]  # 28..36 GB: two can never share one 40 GB GPU
    first = Job("pod-a", "llama3-7b", JobKind.INFERENCE)
    second = Job("pod-b", "llama3-7b", JobKind.INFERENCE)
    verdict = view.evaluate(first, llama)["node-0"]
    assert verdict.feasible
    view.assume(first, llama, verdict)  # bind in flight
    blocked = view.evaluate(second, llama)["node-0"]
    assert not blocked.feasible
    assert "insufficient GPU memory" in blocked.reason
    assert view.forget("pod-a")
    assert view.evaluate(second, llama)["node-0"].feasible


def test_view_starts_from_the_plan_and_prefers_cheap_configurations(families):
    nodes = a100_nodes(2, 1)
    snapshot = Snapshot(nodes, (Job("t", "transformer"),), families)
    result = plan(snapshot)
    running = (
        Job(
            "t",
            "transformer",
            current_config=result.assignments["t"].config_index,
            devices=result.assignments["t"].devices,
        ),
    )
    view = PlacementView(Snapshot(nodes, running, families), result)
    assert view.holds("t")
    verdicts = view.evaluate(Job("new", "dcgan"), families["dcgan"])
    busy = result.assignments["t"].devices[0][0]
    idle = next(n.name for n in nodes if n.name != busy)
    assert verdicts[idle].feasible
    assert verdicts[idle].predicted_slowdown == 1.0


def test_unknown_nodes_and_impossible_jobs_get_reasons_not_errors(families):
    nodes = a100_nodes(1, 1)
    view = PlacementView(Snapshot(nodes, (), families), plan(Snapshot(nodes, (), families)))
    verdicts = view.evaluate(Job("x", "bert"), families["bert"], ["node-0", "ghost"])
    assert list(verdicts) == ["node-0", "ghost"]
    assert not verdicts["ghost"].feasible and "not in its cluster view" in verdicts["ghost"].reason
    floor = view.evaluate(Job("y", "bert", min_throughput=1e9), families["bert"])["node-0"]
    assert not floor.feasible and "throughput floor" in floor.reason
