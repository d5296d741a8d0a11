"""The simulator runs the same closed loop: observing co-located jobs bounds their harm."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.model import Plan
from elastico_extender.sim.engine import ClusterSpec, Simulator
from elastico_extender.sim.runner import Experiment, build_policy, run_experiment
from elastico_extender.sim.traces import synthetic
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable


def test_the_loop_reduces_harm_and_learns_the_observed_pairs():
    # Nine hours: enough harmful pairs (about 70) for a p95 that two outliers cannot move
    # (six hours held about 90 before the planner composed multi-tenant slowdowns, and
    # about 60 after: three step-downs that did not fix their pair then set the p95).
    exp = Experiment(trace=tuple(synthetic(16, 1.5, 9 * 3600.0, 0)), cluster=ClusterSpec(gpus=16))
    results = run_experiment(exp, ["elastico", "elastico+online"], workers=1)
    off, on = results["elastico"], results["elastico+online"]
    assert on.counters["observations"] > 0 and off.counters["observations"] == 0
    # Job-time spent above tolerance: at most a third of the open loop's.
    assert on.counters["above_tolerance_s"] < off.counters["above_tolerance_s"] / 3
    epochs_on = np.array(on.harm_s) / exp.epoch_s
    epochs_off = np.array(off.harm_s) / exp.epoch_s
    assert np.percentile(epochs_on, 95) <= 2.0 + 1e-6 < np.percentile(epochs_off, 95)
    # The corrected predictor knows the pairs it saw better than the base model.
    _hour, pairs, corrected, base = on.mape[-1]
    assert pairs > 0 and corrected < base
    assert all(not r.anomalies for r in results.values())


def test_online_suffix_combines_with_each_predictor():
    exp = Experiment(trace=tuple(synthetic(8, 1.0, 3600.0, 0)), cluster=ClusterSpec(gpus=8))
    configs = ConfigTable.build(0, 0.05)
    truth = GroundTruth.build(configs)
    for name, base in (
        ("elastico+online", "contention-heuristic"),
        ("elastico+iac+online", "table-mape7.6"),
        ("elastico-no-rst+online", "contention-heuristic"),
    ):
        policy = build_policy(name, exp, truth)
        assert policy.loop is not None  # type: ignore[attr-defined]
        assert policy.predictor.name == f"{base}+online"  # type: ignore[attr-defined]
    for bad in ("volcano+online", "elastico+online+iac", "elastico+magic"):
        with pytest.raises(ValueError):
            build_policy(bad, exp, truth)


def _most_squeeze_screens(monkeypatch: pytest.MonkeyPatch, tries: int) -> int:
    """Run the loop at load 1.5 with ``SQUEEZE_TRIES = tries``; the most screens in a squeeze."""
    from elastico_extender.core.planner import squeeze
    from elastico_extender.core.planner.epoch import _Epoch

    monkeypatch.setattr(squeeze, "SQUEEZE_TRIES", tries)
    state = {"inside": False, "screens": 0, "most": 0}
    run, try_row = squeeze.Squeeze.run, _Epoch.try_row

    def counted_run(self, queued):  # type: ignore[no-untyped-def]
        state["inside"], state["screens"] = True, 0
        try:
            return run(self, queued)
        finally:
            state["inside"] = False
            state["most"] = max(state["most"], state["screens"])

    def counted_try(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        state["screens"] += bool(state["inside"])
        return try_row(self, *args, **kwargs)

    monkeypatch.setattr(squeeze.Squeeze, "run", counted_run)
    monkeypatch.setattr(_Epoch, "try_row", counted_try)
    exp = Experiment(trace=tuple(synthetic(16, 1.5, 4 * 3600.0, 0)), cluster=ClusterSpec(gpus=16))
    run_experiment(exp, ["elastico+online"], workers=1)
    return int(state["most"])


def test_a_squeeze_screens_at_most_its_budget(monkeypatch: pytest.MonkeyPatch):
    """The corrected predictor refuses whole family pairs; the squeeze must not retry forever."""
    unbounded = _most_squeeze_screens(monkeypatch, 10**9)
    assert unbounded > 5  # the premise: this trace asks more than the budget below
    assert _most_squeeze_screens(monkeypatch, 5) <= 5


def test_one_window_far_above_tolerance_is_news_at_once():
    """The simulator plans on a single window far above tau (ONE_WINDOW_MARGIN), as the
    extender, planning every epoch, would act on it; one just above tau waits for k."""
    from elastico_extender.core.observations import Observation
    from elastico_extender.core.planner.protect import ONE_WINDOW_MARGIN
    from elastico_extender.sim import engine

    for slowdown, news in ((1.3 * (1 + ONE_WINDOW_MARGIN) * 1.02, True), (1.3 * 1.03, False)):
        sim, loop, _ = _looped_simulator(2)
        sim.status[:] = engine.RUNNING
        sim.tenants[0] = [0, 1]
        sim.tau[:2] = 1.3
        for job in ("j0", "j1"):  # each seen alone first: its own solo rate, no margin
            loop.book.record(Observation(job, 0, 0.0, 30.0, 100.0))
        loop.book.record(Observation("j0", 0, 30.0, 30.0, 100.0 / slowdown, partners=("j1",)))
        loop.book.record(Observation("j1", 0, 30.0, 30.0, 100.0, partners=("j0",)))
        assert sim._loop_news(30.0, epochs_since_plan=0.5) == news, slowdown


def _looped_simulator(jobs: int, **options: float):  # type: ignore[no-untyped-def]
    """(simulator, its closed loop, the jobs' default configuration) for ``jobs`` one-GPU
    jobs of one family on 8 GPUs, nothing started: the test sets the state it needs."""
    from elastico_extender.core.closed_loop import ClosedLoop
    from elastico_extender.sim import engine
    from elastico_extender.sim.traces import TraceJob

    configs = ConfigTable.build(0, 0.05)
    truth = GroundTruth.build(configs)
    family = sorted(configs.families)[0]
    trace = [TraceJob(f"j{i}", 0.0, 1, 3600.0, family) for i in range(jobs)]
    exp = Experiment(trace=tuple(trace), cluster=ClusterSpec(gpus=8))
    policy = build_policy("elastico+online", exp, truth)
    loop: ClosedLoop = policy.loop  # type: ignore[attr-defined]
    sim = engine.Simulator(trace, policy, configs, truth, exp.cluster, loop=loop, **options)
    return sim, loop, configs.default_of(family)


def test_the_loop_plans_when_observed_harm_or_a_waiting_queue_could_change_the_plan():
    """Sharing alone no longer forces a plan every epoch; harm and a waiting queue do."""
    from elastico_extender.core.observations import Observation
    from elastico_extender.core.planner.protect import HARM_WINDOWS
    from elastico_extender.sim import engine

    sim, loop, _ = _looped_simulator(3)
    sim.status[:] = [engine.RUNNING, engine.RUNNING, engine.DONE]
    sim.tenants[0] = [0, 1]
    sim.tau[:2] = 1.3

    def windows(slowdown: float, count: int, start: float) -> float:
        for k in range(count):
            end = start + 30.0 * (k + 1)
            for me, other in (("j0", "j1"), ("j1", "j0")):
                rate = 100.0 / (slowdown if me == "j0" else 1.0)
                loop.book.record(Observation(me, 0, end, 30.0, rate, partners=(other,)))
        return start + 30.0 * count

    for job in ("j0", "j1"):
        loop.book.set_reference(job, 0, "launches/s", 100.0)
    now = windows(1.05, 4, 0.0)  # shared, well within tolerance, nobody waiting
    assert not sim._loop_news(now, epochs_since_plan=50.0)
    sim.status[2] = engine.PENDING  # a waiting job: plan, but only every few epochs
    assert not sim._loop_news(now, epochs_since_plan=engine.LOOP_QUEUE_REPLAN_EPOCHS - 1)
    assert sim._loop_news(now, epochs_since_plan=engine.LOOP_QUEUE_REPLAN_EPOCHS)
    sim.status[2] = engine.DONE
    now = windows(1.6, HARM_WINDOWS, now)
    assert sim._loop_news(now, epochs_since_plan=0.0)  # observed harm: plan at once
    sim._saw(Plan(epoch=1, prices=np.zeros(4), assignments={}))  # the plan saw it
    now = windows(1.6, 1, now)
    assert not sim._loop_news(now, epochs_since_plan=1.0)  # the same case: same answer
    # A plan that acted on the case (stepped j0 down) leaves a new one: harm that
    # survives the step-down is planned on at once, as the extender does every epoch.
    step = ("j0", "j1", "step-down", "j0", 1.6, 1.3)
    sim._saw(Plan(epoch=2, prices=np.zeros(4), assignments={}, protections=(step,)))
    now = windows(1.6, 1, now)
    assert sim._loop_news(now, epochs_since_plan=1.0)


@pytest.mark.parametrize("left_at", [15.0, 25.0])
def test_a_window_a_partner_left_part_way_through(left_at: float) -> None:
    """j1 leaves j0's GPU at ``left_at`` of a 30 s window.  Half-way, the window is neither
    j0's solo rate nor its rate next to j1 (diluted harm): as the node agent does, the
    simulator marks it mixed; it counts as j0's slowdown, labelled with j1, but teaches
    nothing (once it taught a mild pair sample), and the next window, alone all through,
    is j0's solo rate.  With a sixth to go, j1 was there for more than MIN_SHARED_SHARE
    of it: a sample of the pair, diluted by under a third, labelled."""
    from elastico_extender.sim import engine

    sim, loop, gid = _looped_simulator(2, noise=0.0)
    sim.status[:] = engine.RUNNING
    sim.gid[:] = gid
    sim.tenants[0] = [0, 1]
    sim.devices[0] = sim.devices[1] = (0,)
    sim._update_rates(0.0)
    sim._record(0.0, left_at)
    sim.status[1] = engine.DONE
    sim.tenants[0] = [0]
    sim._update_rates(left_at)
    sim._record(left_at, 30.0)
    sim._observe(30.0)
    seen = loop.observed()["j0"]
    assert seen.partners == ("j1",) and not seen.solo_reference
    mixed = left_at < 20.0
    assert sim.counters["mixed_windows"] == int(mixed)
    assert sim._observed_pairs == (set() if mixed else {(int(gid), int(gid))})
    sim._record(30.0, 60.0)
    sim._observe(60.0)
    seen = loop.observed()["j0"]
    assert seen.partners == () and seen.solo_reference
    assert seen.recent[-1] == pytest.approx(1.0)


def test_every_plan_records_the_cases_of_harm_of_its_own_epoch():
    """The harm flags a plan is taken to have answered (``_saw``) are judged at that plan's
    own epoch, even when a plan was due anyway (an arrival, a waiting queue): flags left
    from an earlier epoch took later cases as answered and skipped plans the extender makes."""
    sim = loop_simulator(6.0)
    judged: list[float] = []  # when the harm flags were last judged
    planned: list[float] = []  # when each plan's snapshot was taken
    stale: list[tuple[float, float]] = []
    news, snapshot, saw = sim._loop_news, sim.snapshot, sim._saw

    def judging(now: float, epochs_since_plan: float) -> bool:
        judged.append(now)
        return news(now, epochs_since_plan)

    def snapping(epoch: int, now: float):  # type: ignore[no-untyped-def]
        planned.append(now)
        return snapshot(epoch, now)

    def seeing(plan: Plan) -> None:
        if not judged or judged[-1] != planned[-1]:
            stale.append((planned[-1], judged[-1] if judged else float("nan")))
        saw(plan)

    sim._loop_news, sim.snapshot, sim._saw = judging, snapping, seeing  # type: ignore[method-assign]
    sim.run()
    assert len(planned) > 20 and judged
    assert not stale, f"{len(stale)} of {len(planned)} plans recorded older flags: {stale[:3]}"


def test_each_separation_records_the_victims_true_slowdown_over_its_tolerance():
    """``RunResult.separated_truth``: per job a plan separates for observed harm, the
    simulator's true slowdown of it over its tau at that plan, before the plan acts (the
    figure that tells a real harm from a false alarm)."""
    sim = loop_simulator(4.0)
    expected: list[float] = []
    saw = sim._saw

    def seeing(plan: Plan) -> None:
        firsts = {p[0]: p[5] for p in plan.protections}
        expected.extend(float(sim.slow[sim.index[v]]) / tau for v, tau in firsts.items())
        saw(plan)

    sim._saw = seeing  # type: ignore[method-assign]
    result = sim.run()
    assert len(expected) > 5
    assert result.separated_truth == pytest.approx(expected)
    assert any(x > 1.0 for x in expected) and all(x > 0 for x in expected)
    exp = Experiment(trace=tuple(sim.trace), cluster=ClusterSpec(gpus=16))
    off = run_experiment(exp, ["elastico"], workers=1)["elastico"]
    assert off.separated_truth == []


def loop_simulator(hours: float) -> Simulator:
    """``elastico+online`` on 16 GPUs at load 1.5 for ``hours``, seed 0, ready to run."""
    exp = Experiment(
        trace=tuple(synthetic(16, 1.5, hours * 3600.0, 0)), cluster=ClusterSpec(gpus=16)
    )
    configs = ConfigTable.build(0, 0.05)
    truth = GroundTruth.build(configs)
    policy = build_policy("elastico+online", exp, truth)
    loop = policy.loop  # type: ignore[attr-defined]
    return Simulator(list(exp.trace), policy, configs, truth, exp.cluster, loop=loop)
