"""Randomised invariants of the planner core over small clusters and job mixes.

Each case builds a cluster and a job mix through the records the drivers use
(``Snapshot``, ``Job``, ``Node``), runs a few epochs of ``plan`` applying each
plan as the simulator does, and checks every plan: capacity, gangs, actions,
accounting of every job, prices, determinism.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace

import numpy as np
import pytest

from elastico_extender.core.closed_loop import ClosedLoop, RunningConfig
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import (
    Action,
    GpuDevice,
    Job,
    JobKind,
    Node,
    Plan,
    ProfileFamily,
    Snapshot,
)
from elastico_extender.core.observations import Observation
from elastico_extender.core.planner import plan
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.settings import PlannerSettings

MARGIN = PlannerSettings().memory_margin_mib


def _ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


SIZES = (24 * 1024, 40 * 1024, 40 * 1024, 80 * 1024)


def random_cluster(rng: np.random.Generator) -> tuple[Node, ...]:
    nodes = []
    for n in range(int(rng.integers(1, 4))):
        mib = float(rng.choice(SIZES))
        gpus = tuple(GpuDevice(g, mib, f"gpu-{int(mib)}") for g in range(int(rng.integers(1, 5))))
        nodes.append(Node(f"node-{n}", gpus))
    return tuple(nodes)


def random_jobs(families, rng: np.random.Generator, count: int) -> tuple[Job, ...]:
    names = sorted(families)
    jobs = []
    for i in range(count):
        name = names[int(rng.integers(len(names)))]
        fam = families[name]
        gpus = int(rng.choice([1, 1, 1, 2, 3])) if fam.kind is JobKind.TRAINING else 1
        floor = float(fam.throughput.max() * rng.choice([0.0, 0.0, 0.3, 0.7]))
        jobs.append(
            Job(
                f"j{i}",
                name,
                fam.kind,
                gpus,
                float(rng.choice([0.5, 1.0, 1.0, 2.0])),
                floor,
                arrival_time=float(rng.integers(0, 5)),
            )
        )
    return tuple(jobs)


def applied(snapshot: Snapshot, result: Plan, now: float) -> Snapshot:
    """The next snapshot: every assignment applied, the rest pending (as the simulator does)."""
    jobs = []
    for job in snapshot.jobs:
        a = result.assignments.get(job.id)
        if a is None:
            jobs.append(replace(job, current_config=None, devices=(), started_at=None))
        else:
            started = job.started_at if job.running else now
            jobs.append(
                replace(job, current_config=a.config_index, devices=a.devices, started_at=started)
            )
    return replace(snapshot, jobs=tuple(jobs), epoch=snapshot.epoch + 1, now=now)


def check_plan(snapshot: Snapshot, result: Plan) -> None:
    """Every invariant one plan must hold against the snapshot it was made from."""
    jobs = {j.id: j for j in snapshot.jobs}
    capacity = {(n.name, g.index): g.memory_mib - MARGIN for n in snapshot.nodes for g in n.gpus}
    used_mem: dict = defaultdict(float)
    used_sm: dict = defaultdict(float)
    for job_id, a in result.assignments.items():
        job = jobs[job_id]
        family = snapshot.families[job.family]
        assert a.job_id == job_id
        assert 0 <= a.config_index < family.size
        if job.allowed is not None:
            assert a.config_index in job.allowed or a.config_index == job.current_config
        # A gang is placed whole, on distinct devices that exist.
        assert len(a.devices) == job.gpus, (job_id, a.devices)
        assert len(set(a.devices)) == len(a.devices), (job_id, a.devices)
        for ref in a.devices:
            assert ref in capacity, (job_id, ref)
            used_mem[ref] += family.resources[a.config_index, GPU_MEM]
            used_sm[ref] += family.resources[a.config_index, GPU_SM]
        # Actions say what changed.
        if not job.running:
            assert a.action is Action.ADMIT, (job_id, a.action)
        elif a.action is Action.KEEP:
            assert a.config_index == job.current_config and set(a.devices) == set(job.devices)
        elif a.action is Action.RECONFIGURE:
            assert a.config_index != job.current_config and set(a.devices) == set(job.devices)
        else:
            assert a.action is Action.MIGRATE and set(a.devices) != set(job.devices), job_id
        assert a.throughput >= job.min_throughput - 1e-9 or a.config_index == job.current_config
        assert np.isfinite(a.predicted_slowdown) and a.predicted_slowdown >= 1.0
        assert np.isfinite(a.tolerance) and a.tolerance >= 1.0
    for ref, mem in used_mem.items():
        assert mem <= capacity[ref] + 1e-6, f"{ref} over memory: {mem} > {capacity[ref]}"
        assert used_sm[ref] <= 1.0 + 1e-9, f"{ref} over SM: {used_sm[ref]}"
    # Every job is accounted for exactly once.
    placed, queued = set(result.assignments), set(result.queued)
    rejected, preempted = set(result.rejected), set(result.preempted)
    assert not placed & queued and not placed & rejected and not queued & rejected
    assert not placed & preempted
    running = {j.id for j in snapshot.jobs if j.running}
    assert preempted <= running
    assert placed | queued | rejected | preempted == set(jobs)
    assert running <= placed | preempted
    # Prices finite and non-negative.
    assert result.prices.shape == (4,)
    assert np.all(np.isfinite(result.prices)) and np.all(result.prices >= 0), result.prices
    assert result.utilization is None or np.isfinite(result.utilization)


def summary(result: Plan) -> tuple:
    """What a plan decides, comparable between two runs."""
    return (
        sorted(
            (j, a.config_index, a.devices, a.action.value) for j, a in result.assignments.items()
        ),
        sorted(result.queued),
        sorted(result.rejected.items()),
        sorted(result.preempted),
        result.prices.tolist(),
    )


@pytest.mark.parametrize("seed", range(12))
def test_random_mixes_hold_every_invariant_over_epochs(families, seed):
    rng = np.random.default_rng(seed)
    snapshot = Snapshot(
        random_cluster(rng), random_jobs(families, rng, int(rng.integers(1, 16))), families
    )
    previous: Plan | None = None
    for epoch in range(4):
        result = plan(snapshot, previous)
        check_plan(snapshot, result)
        assert summary(plan(snapshot, previous)) == summary(result)  # deterministic
        if previous is not None and epoch >= 1:
            # Applied plans fit, so a running job never has to be preempted.
            assert result.preempted == (), result.preempted
        previous = result
        snapshot = applied(snapshot, result, now=60.0 * (epoch + 1))


def co_located(result: Plan, a: str, b: str) -> bool:
    first, second = result.assignments.get(a), result.assignments.get(b)
    return bool(first and second and set(first.devices) & set(second.devices))


def observe_epoch(
    loop: ClosedLoop, snapshot: Snapshot, truth: dict, rng: np.random.Generator, now: float
) -> None:
    """One window per running job: its profile rate over the slowdown its partners'
    true pair slowdowns compose to, with 3% noise (the simulator's model)."""
    running = [j for j in snapshot.jobs if j.running]
    families = snapshot.families
    configs = {j.id: RunningConfig(j.family, j.current_config or 0) for j in running}
    windows = []
    for job in running:
        partners = tuple(
            sorted(o.id for o in running if o.id != job.id and set(o.devices) & set(job.devices))
        )
        slowdown = 1.0 + sum(truth[job.family, configs[p].family] - 1.0 for p in partners)
        solo = float(families[job.family].throughput[job.current_config])
        if loop.book.reference(job.id, job.current_config, "samples/s") is None:
            loop.book.set_reference(job.id, job.current_config, "samples/s", solo)
        rate = solo / slowdown * float(rng.lognormal(0.0, 0.03))
        windows.append(
            Observation(job.id, job.current_config or 0, now, 30.0, rate, "samples/s", partners)
        )
    loop.record(windows, configs, families)


def closed_loop_epochs(
    snapshot: Snapshot, truth: dict, rng: np.random.Generator, epochs: int, window_s: float
) -> Iterator[tuple[int, Snapshot, Plan | None, Plan]]:
    """Drive ``snapshot`` as the simulator does: each epoch plans on what ``ClosedLoop``
    observed, yields (epoch, the snapshot planned, the previous plan, the plan), applies
    the plan, then reports two windows of ``window_s`` each over the true slowdowns."""
    loop = ClosedLoop(OnlineCorrection(ContentionPredictor()))
    previous: Plan | None = None
    now = 0.0
    for epoch in range(epochs):
        snapshot = replace(snapshot, observed=loop.observed(), now=now)
        result = plan(snapshot, previous, predictor=loop.correction)
        yield epoch, snapshot, previous, result
        previous = result
        snapshot = applied(snapshot, result, now)
        for _ in range(2):
            now += window_s
            observe_epoch(loop, snapshot, truth, rng, now)


@pytest.mark.parametrize("seed", range(8))
def test_closed_loop_keeps_separated_pairs_apart_and_states_every_move(families, seed):
    """Driven as the simulator drives it (``ClosedLoop`` over true pair slowdowns): a pair
    the plan separated is not co-located in that plan or the next; a pair steps down at
    most once; a running job leaves its devices or the plan only for a reason the plan
    states (a protection), or off a device it shared: to an idle GPU (spread), or away
    from a partner an interference round forbade (``running._place_conflicted``)."""
    rng = np.random.default_rng(1000 + seed)
    lstm = families["lstm"]
    # A workload never profiled (every row estimated, one configuration like the
    # service's unprofiled family): its jobs run alone until observed.
    unknown = ProfileFamily(
        "unknown", lstm.kind, lstm.configs[:1], lstm.resources[:1], lstm.throughput[:1],
        lstm.features[:1], estimated=np.ones(1, dtype=bool),
    )  # fmt: skip
    families = {**families, "unknown": unknown}
    names = sorted(families)
    truth = {(a, b): float(rng.choice([1.0, 1.2, 1.6, 2.5])) for a in names for b in names}
    jobs = [
        replace(j, family="unknown", kind=unknown.kind, gpus=1, min_throughput=0.0)
        if rng.random() < 0.25
        else j
        for j in random_jobs(families, rng, int(rng.integers(4, 16)))
    ]
    start = Snapshot(random_cluster(rng), tuple(jobs), families)
    # two windows per epoch, as the simulator reports
    for epoch, snapshot, previous, result in closed_loop_epochs(start, truth, rng, 5, 30.0):
        check_plan(snapshot, result)
        for a, b in result.separated + (previous.separated if previous else ()):
            assert not co_located(result, a, b), (epoch, a, b)
        acted = {(action, actor) for _, _, action, actor, _, _ in result.protections}
        for victim, partner, action, _, _, _ in result.protections:
            if action == "step-down" and previous is not None:
                assert _ordered(victim, partner) not in previous.stepped, (victim, partner)
        assert all(("requeue", j) in acted for j in result.preempted), result.protections
        before = {j.id: set(j.devices) for j in snapshot.jobs if j.running}
        tenants: dict = defaultdict(set)
        for job_id, a in result.assignments.items():
            for ref in a.devices:
                tenants[ref].add(job_id)
        for job in snapshot.jobs:
            if job.family == "unknown" and job.id not in snapshot.observed and snapshot.observed:
                devices = result.assignments[job.id].devices if job.id in result.assignments else ()
                assert all(tenants[ref] == {job.id} for ref in devices), (epoch, job.id)
        for job_id, a in result.assignments.items():
            if a.action is Action.MIGRATE and ("move", job_id) not in acted:
                was = before[job_id]
                shared = any(o != job_id and was & d for o, d in before.items())
                assert shared, (epoch, job_id, was, a.devices)


@pytest.mark.parametrize("seed", range(40))
def test_a_job_the_driver_cannot_stop_is_never_moved_or_preempted(families, seed):
    """``Job.preemptible`` False (in a cluster, a pod nothing would evict): whatever the
    closed loop observes, the plan keeps such a running job on its devices and never
    preempts or requeues it; band preemption, protect, spread and the interference rounds
    choose among the jobs that can leave.  Epochs 20 minutes apart, so jobs run long
    enough to be band-preemption victims."""
    rng = np.random.default_rng(2000 + seed)
    names = sorted(families)
    truth = {(a, b): float(rng.choice([1.0, 1.2, 1.6, 2.5])) for a in names for b in names}
    jobs = random_jobs(families, rng, int(rng.integers(4, 16)))
    jobs = tuple(replace(j, preemptible=bool(rng.random() < 0.5)) for j in jobs)
    start = Snapshot(random_cluster(rng), jobs, families)
    for epoch, snapshot, _, result in closed_loop_epochs(start, truth, rng, 6, 600.0):
        for job in snapshot.jobs:
            if job.running and not job.preemptible:
                assert job.id not in result.preempted, (epoch, job.id, result.protections)
                kept = result.assignments[job.id].devices
                assert set(kept) == set(job.devices), (epoch, job.id, result.protections)
