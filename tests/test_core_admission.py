"""Per-pod placement between epochs: the view the extender's verbs read."""

from __future__ import annotations

from conftest import a100_nodes

from elastico_extender.core.model import Job, JobKind, Snapshot
from elastico_extender.core.planner import PlacementView, plan
from elastico_extender.core.planner.admission import MAX_SCREENED_DEVICES, SCREENED_PER_NODE


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


def _busy_view(families, nodes, tenants):
    """A view whose plan keeps ``tenants`` ((job id, family, node, device) each) running."""
    running = []
    for job_id, family, node, device in tenants:
        config = families[family].fastest_index
        running.append(Job(job_id, family, current_config=config, devices=((node, device),)))
    snapshot = Snapshot(nodes, tuple(running), families)
    return PlacementView(snapshot, plan(snapshot))


def test_one_answer_for_all_nodes_equals_one_evaluation_per_node(families):
    nodes = a100_nodes(8, 4)
    tenants = [
        (f"t{n}-{d}", ("ncf", "lstm", "dcgan", "bert")[(n + d) % 4], f"node-{n}", d)
        for n in range(8)
        for d in range(n % 5)
    ]
    view = _busy_view(families, nodes, tenants)
    for family, gpus in [("ncf", 1), ("dcgan", 1), ("bert", 2), ("resnet50", 4), ("lstm", 3)]:
        job = Job(f"new-{family}", family, gpus=gpus)
        answers = view.answer(job, families[family])
        for i, name in enumerate(view.names):
            alone = view.evaluate(job, families[family], [name])[name]
            assert answers.verdict(i, name) == alone, (family, gpus, name)
            assert bool(answers.feasible[i]) == alone.feasible
            assert answers.reason(i) == alone.reason


def test_only_gpus_the_job_could_take_are_screened_for_interference(families):
    # 200 nodes with two idle GPUs each, then one node full of small tenants: the job
    # would take an idle GPU on the first 200, so only the full node's GPUs are screened
    # (before, their busy GPUs took the whole screening budget of one configuration).
    nodes = a100_nodes(201, 4)
    tenants = [(f"a{n}-{d}", "ncf", f"node-{n}", d) for n in range(200) for d in range(2)]
    tenants += [(f"z-{d}", "ncf", "node-200", d) for d in range(4)]
    view = _busy_view(families, nodes, tenants)
    screened: list[int] = []
    predict = view.placer.predict_against

    def recording(devices, features, tolerance, gpus=1):
        screened.append(len(devices))
        return predict(devices, features, tolerance, gpus)

    view.placer.predict_against = recording  # type: ignore[method-assign]
    job = Job("small", "lstm")
    answers = view.answer(job, families["lstm"])
    assert answers.feasible.all()
    assert screened and max(screened) == SCREENED_PER_NODE  # per configuration tried
    assert MAX_SCREENED_DEVICES < 2 * 200
    last = answers.verdict(200, "node-200")
    assert last.predicted_slowdown > 1.0  # shares a GPU, and it is safe
    assert last == view.evaluate(job, families["lstm"], ["node-200"])["node-200"]


def test_the_view_judges_interference_at_the_plans_tolerance(families):
    """Between plans a pod is screened at the tau the plan judged every pair by: the
    plan's U(t) (offered load, queue included), not the share it allocated."""
    from elastico_extender.core.interference.tolerance import planner_tolerance
    from elastico_extender.core.settings import PlannerSettings

    nodes = a100_nodes(3, 1)
    queue = tuple(Job(f"q{i}", "bert", gpus=2) for i in range(6))  # a long queue: U above target
    result = plan(Snapshot(nodes, queue, families))
    allocated = max(result.stats["sm_allocated"], result.stats["memory_allocated"])
    assert result.utilization is not None and result.utilization > allocated + 0.1
    view = PlacementView(Snapshot(nodes, queue, families), result)
    verdicts = view.evaluate(Job("new", "ncf"), families["ncf"])
    judged = [v for v in verdicts.values() if v.feasible]
    assert judged, "the idle GPU takes the small job"
    for verdict in judged:
        throughput = families["ncf"].throughput[[verdict.config_index]]
        expected = planner_tolerance(throughput, [0.0], result.utilization, PlannerSettings())[0]
        assert verdict.tolerance == expected
