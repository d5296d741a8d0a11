"""Closed loop, Protect: pairs observed above tolerance are separated within k windows."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import Constant, a100_nodes

from elastico_extender.core.interference.features import JOB_FEATURES, NUM_JOB_FEATURES
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import Job, Plan, Snapshot
from elastico_extender.core.observations import Observation, ObservationBook
from elastico_extender.core.planner import plan as core_plan
from elastico_extender.core.planner.protect import HARM_WINDOWS
from elastico_extender.core.settings import PlannerSettings

WINDOW_S = 5.0
BLIND = ContentionPredictor(sm_weight=0.0, dram_weight=0.0, pressure_weight=0.0)
"""A predictor that knows nothing of these jobs (answers 1.0): only observation can
tell the planner the pair hurts, and the spread pass (S_hat > 1.05) never moves it."""


def plan(snapshot: Snapshot, previous: Plan | None = None) -> Plan:
    return core_plan(snapshot, previous, predictor=BLIND)


def shared_pair(families, gpus: int) -> Snapshot:
    """bert and resnet running together on GPU 0 of one node with ``gpus`` GPUs."""
    first = plan(
        Snapshot(a100_nodes(1, 1), (Job("bert", "bert"), Job("resnet", "resnet50")), families)
    )
    assert set(first.assignments) == {"bert", "resnet"}
    jobs = []
    for job_id, family, arrival in (("bert", "bert", 0.0), ("resnet", "resnet50", 10.0)):
        a = first.assignments[job_id]
        jobs.append(
            Job(
                job_id,
                family,
                current_config=a.config_index,
                devices=(("node-0", 0),),
                arrival_time=arrival,
            )
        )
    return Snapshot(a100_nodes(1, gpus), tuple(jobs), families, epoch=1)


def observe(book: ObservationBook, snapshot: Snapshot, slowdown: float, end: float) -> None:
    """One window per running job: solo rate 100, shared rate 100 / slowdown."""
    running = [j for j in snapshot.jobs if j.devices]
    for job in running:
        partners = tuple(
            o.id for o in running if o.id != job.id and set(o.devices) & set(job.devices)
        )
        if book.reference(job.id, job.current_config, "launches/s") is None:
            book.set_reference(job.id, job.current_config, "launches/s", 100.0)
        rate = 100.0 / slowdown if partners else 100.0
        book.record(
            Observation(job.id, job.current_config, end, WINDOW_S, rate, "launches/s", partners)
        )


def devices_of(result: Plan) -> dict[str, tuple]:
    return {job: a.devices for job, a in result.assignments.items()}


def seen_alone(book: ObservationBook, snapshot: Snapshot) -> None:
    """One solo window per running job at rate 100: its own solo rate, no reference margin."""
    for job in snapshot.jobs:
        if job.devices:
            book.record(Observation(job.id, job.current_config, 0.0, WINDOW_S, 100.0))


def test_pair_above_tolerance_is_moved_apart_after_k_windows(families):
    """Above tau, but within one window's noise of it: k windows make the case."""
    snapshot = shared_pair(families, gpus=2)
    tau = plan(snapshot).assignments["bert"].tolerance
    book = ObservationBook(smoothing=1.0)
    seen_alone(book, snapshot)
    result = None
    for k in range(1, HARM_WINDOWS + 1):
        observe(book, snapshot, slowdown=tau * 1.05, end=k * WINDOW_S)
        snap = replace(snapshot, observed=book.observed(), now=k * WINDOW_S, epoch=k)
        result = plan(snap)
        shared = devices_of(result)["bert"] == devices_of(result)["resnet"]
        assert shared == (k < HARM_WINDOWS), f"window {k}: {devices_of(result)}"
    assert result is not None
    assert result.stats["separations"] == 1.0
    (_victim, _partner, action, _actor, observed, tau) = result.protections[0]
    assert action == "move" and observed > tau
    assert result.separated == (("bert", "resnet"),)


def test_one_window_far_above_tolerance_separates_at_once(families):
    """Observed beats predicted: a window above tau by more than the noise of one window
    (ONE_WINDOW_MARGIN) needs no second window; one just above tau waits for k."""
    from elastico_extender.core.planner.protect import ONE_WINDOW_MARGIN

    snapshot = shared_pair(families, gpus=2)
    tau = plan(snapshot).assignments["bert"].tolerance
    for slowdown, apart in ((tau * (1 + ONE_WINDOW_MARGIN) * 1.02, True), (tau * 1.03, False)):
        book = ObservationBook(smoothing=1.0)
        seen_alone(book, snapshot)
        observe(book, snapshot, slowdown=slowdown, end=WINDOW_S)
        result = plan(replace(snapshot, observed=book.observed(), now=WINDOW_S, epoch=1))
        shared = devices_of(result)["bert"] == devices_of(result)["resnet"]
        assert shared != apart, (slowdown, tau, devices_of(result))
        if apart:
            assert result.protections and result.protections[0][0] == "bert"


def test_without_observations_the_pair_stays_as_planned(families):
    snapshot = shared_pair(families, gpus=2)
    result = plan(snapshot)
    assert devices_of(result)["bert"] == devices_of(result)["resnet"]
    assert result.separated == () and result.protections == ()


def test_within_tolerance_keeps_sharing(families):
    snapshot = shared_pair(families, gpus=2)
    book = ObservationBook(smoothing=1.0)
    for k in range(1, 4):
        observe(book, snapshot, slowdown=1.1, end=k * WINDOW_S)
    result = plan(replace(snapshot, observed=book.observed(), now=3 * WINDOW_S))
    assert devices_of(result)["bert"] == devices_of(result)["resnet"]


def test_stale_observations_leave_the_last_decision(families):
    snapshot = shared_pair(families, gpus=2)
    book = ObservationBook(smoothing=1.0)
    for k in range(1, 4):
        observe(book, snapshot, slowdown=2.5, end=k * WINDOW_S)
    result = plan(replace(snapshot, observed=book.observed(), now=10_000.0))
    assert devices_of(result)["bert"] == devices_of(result)["resnet"]


def test_no_idle_gpu_requeues_the_newer_job_and_holds_the_pair_apart(families):
    snapshot = shared_pair(families, gpus=1)
    book = ObservationBook(smoothing=1.0)
    for k in range(1, HARM_WINDOWS + 1):
        observe(book, snapshot, slowdown=3.0, end=k * WINDOW_S)
    result = plan(replace(snapshot, observed=book.observed(), now=HARM_WINDOWS * WINDOW_S))
    assert "resnet" in result.preempted  # the newer of the two goes back to the queue
    assert set(result.assignments) == {"bert"}
    # Next epoch: resnet is pending, the GPU has room, the predictor would admit it,
    # but the pair is held apart (hysteresis) because the previous plan says so.
    bert = result.assignments["bert"]
    jobs = (
        Job("bert", "bert", current_config=bert.config_index, devices=bert.devices),
        Job("resnet", "resnet50", arrival_time=10.0),
    )
    later = Snapshot(snapshot.nodes, jobs, families, epoch=5)
    assert "resnet" in plan(later).assignments  # without the loop's memory it would share
    held = plan(later, result)
    assert "resnet" not in held.assignments and "resnet" in held.queued
    assert held.separated == (("bert", "resnet"),)


def test_an_unknown_workload_runs_alone_until_observed(families):
    """A family with no measured configuration shares only after it has been observed."""
    import numpy as np

    from elastico_extender.core.model import ProfileFamily
    from elastico_extender.core.observations import ObservedSlowdown
    from elastico_extender.profiles.observed import record_solo_profile
    from elastico_extender.profiles.store import ProfileStore

    resnet = families["resnet50"]
    mystery = replace(resnet, workload="mystery", estimated=np.ones(resnet.size, dtype=bool))
    fams = {**families, "mystery": mystery}
    shared = shared_pair(families, gpus=1)
    bert = next(j for j in shared.jobs if j.id == "bert")
    newcomer = Job("new", "mystery", arrival_time=20.0)
    seen = {"bert": ObservedSlowdown(1.0, 4, 5.0, (1.0,) * 4)}
    snap = Snapshot(shared.nodes, (bert, newcomer), fams, epoch=2, observed=seen, now=5.0)
    assert "new" in plan(replace(snap, observed={})).assignments  # without the loop: shares
    assert "new" not in plan(snap).assignments  # loop engaged: it waits for an idle GPU
    # Observed alone (its solo reference known), it may share.
    observed = {**seen, "new": ObservedSlowdown(1.0, 1, 5.0, (1.0,))}
    assert "new" in plan(replace(snap, observed=observed)).assignments

    # Its solo window becomes the family's measured profile through the profile store.
    store = ProfileStore()
    window = Observation(
        "new", 0, 5.0, 5.0, 321.0, mystery.throughput_unit, (), peak_mem_mib=9000.0, sm_activity=0.4
    )
    assert record_solo_profile(store, mystery, window, measured_at=5.0)
    measured: ProfileFamily = store.family(mystery)
    assert not measured.estimated[0] and measured.throughput[0] == 321.0
    assert measured.resources[0, 1] == 9000.0
    shared_window = replace(window, partners=("bert",))
    assert not record_solo_profile(store, mystery, shared_window, measured_at=6.0)


def test_an_unknown_workload_with_fewer_configurations_still_runs_alone(families):
    """The service's unprofiled family has one configuration, catalog ones up to 198: the
    run-alone rule must not depend on which family of the snapshot has the most rows."""
    import numpy as np

    from elastico_extender.core.model import ProfileFamily
    from elastico_extender.core.observations import ObservedSlowdown

    resnet = families["resnet50"]
    assert families["bert"].size > 1  # the premise: the partner's family has more rows
    mystery = ProfileFamily(
        "mystery",
        resnet.kind,
        resnet.configs[:1],
        resnet.resources[:1],
        resnet.throughput[:1],
        resnet.features[:1],
        estimated=np.ones(1, dtype=bool),
    )
    shared = shared_pair(families, gpus=1)
    bert = next(j for j in shared.jobs if j.id == "bert")
    seen = {"bert": ObservedSlowdown(1.0, 4, 5.0, (1.0,) * 4)}
    snap = Snapshot(
        shared.nodes,
        (bert, Job("new", "mystery", arrival_time=20.0)),
        {**families, "mystery": mystery},
        epoch=2,
        observed=seen,
        now=5.0,
    )
    assert "new" in plan(replace(snap, observed={})).assignments  # without the loop: shares
    assert "new" not in plan(snap).assignments  # loop engaged: it waits for an idle GPU


def band_case(families) -> tuple[Snapshot, float, dict]:
    """bert running alone on a one-GPU node, resnet queued; a prediction just inside
    both tolerances (3% below the tighter one, inside the admission band)."""
    from elastico_extender.core.observations import ObservedSlowdown
    from elastico_extender.core.planner.band import ADMIT_BAND

    shared = shared_pair(families, gpus=1)
    bert = next(j for j in shared.jobs if j.id == "bert")
    snap = Snapshot(
        shared.nodes, (bert, Job("resnet", "resnet50", arrival_time=10.0)), families, epoch=2
    )
    open_loop = core_plan(snap, None, predictor=Constant(1.0))
    tau = min(a.tolerance for a in open_loop.assignments.values())
    assert set(open_loop.assignments) == {"bert", "resnet"}
    level = 0.97 * tau
    assert level * (1.0 + ADMIT_BAND) > tau  # inside the band
    seen = {"bert": ObservedSlowdown(1.0, 4, 5.0, (1.0,) * 4)}  # observed, alone
    return replace(snap, now=5.0), level, seen


def test_loop_admits_a_new_pair_only_clear_of_the_band(families):
    """Predicted within tau but inside the admission band: shares without the loop,
    waits with it (it would be separated on its profile-referenced evidence)."""
    snap, level, seen = band_case(families)
    predictor = Constant(level)
    assert "resnet" in core_plan(snap, None, predictor=predictor).assignments  # open loop
    engaged = core_plan(replace(snap, observed=seen), None, predictor=predictor)
    assert "resnet" not in engaged.assignments and "resnet" in engaged.queued
    # Clear of the band, the loop admits it too.
    clear = core_plan(replace(snap, observed=seen), None, predictor=Constant(1.0))
    assert "resnet" in clear.assignments


def test_the_band_guards_admission_only_a_running_pair_within_tau_stays(families):
    """Hysteresis: the same prediction does not evict a pair already sharing, whose
    observations are within tolerance."""
    _, level, _ = band_case(families)
    snapshot = shared_pair(families, gpus=1)
    book = ObservationBook(smoothing=1.0)
    for k in range(1, 5):
        observe(book, snapshot, slowdown=1.05, end=k * WINDOW_S)
    result = core_plan(
        replace(snapshot, observed=book.observed(), now=4 * WINDOW_S),
        None,
        predictor=Constant(level),
    )
    assert set(result.assignments) == {"bert", "resnet"}
    assert devices_of(result)["bert"] == devices_of(result)["resnet"]
    assert result.protections == ()


def test_the_extender_view_applies_the_same_band(families):
    """Filter/prioritize between epochs (PlacementView) refuse what the epoch refuses."""
    from elastico_extender.core.planner import PlacementView

    snap, level, seen = band_case(families)
    shared = core_plan(snap, None, predictor=Constant(1.0))  # bert's devices as planned
    bert = tuple(j for j in snap.jobs if j.id == "bert")
    alone = replace(snap, jobs=bert)
    newcomer = Job("resnet", "resnet50", arrival_time=10.0)
    resnet = families["resnet50"]
    for observed, feasible in (({}, True), (seen, False)):
        view = PlacementView(replace(alone, observed=observed), shared, predictor=Constant(level))
        verdict = view.evaluate(newcomer, resnet)["node-0"]
        assert verdict.feasible == feasible, (observed, verdict)
    assert "admission band" in verdict.reason


def gang_case(families, gpus: int) -> tuple[Snapshot, float, dict]:
    """Two one-GPU ncf jobs, one on each GPU of a two-GPU node, both observed alone, and
    a queued resnet job of ``gpus`` GPUs, which can only start next to them; the
    prediction between the one-GPU band and the gang's band of the tighter tolerance."""
    from elastico_extender.core.observations import ObservedSlowdown
    from elastico_extender.core.planner.band import ADMIT_BAND, WIDE_JOB_BAND

    nodes = a100_nodes(1, 2)
    running = tuple(
        Job(f"ncf-{g}", "ncf", current_config=0, devices=(("node-0", g),)) for g in (0, 1)
    )
    newcomer = Job("new", "resnet50", gpus=gpus, arrival_time=10.0)
    snap = Snapshot(nodes, (*running, newcomer), families, epoch=2, now=5.0)
    open_loop = core_plan(snap, None, predictor=Constant(1.0))
    assert "new" in open_loop.assignments and len(open_loop.assignments["new"].devices) == gpus
    tau = min(a.tolerance for a in open_loop.assignments.values())
    level = tau / (1.0 + ADMIT_BAND + WIDE_JOB_BAND / 2)  # clears the narrow band only
    seen = {j.id: ObservedSlowdown(1.0, 4, 5.0, (1.0,) * 4) for j in running}
    return snap, level, seen


GANG_BAND = PlannerSettings(gang_band=True)


def test_with_the_gang_band_a_gang_must_clear_a_wider_band_than_a_one_gpu_job(families):
    """``planner.gang_band``: a requeued gang waits for all its GPUs to free at once, so
    while the loop is engaged a job of two GPUs is not co-located on a prediction a
    one-GPU job may start on.  Off (the default), both start on it."""
    verdicts = {}
    for gpus in (1, 2):
        snap, level, seen = gang_case(families, gpus)
        predictor = Constant(level)
        engaged = replace(snap, observed=seen)
        assert "new" in core_plan(snap, None, predictor=predictor, settings=GANG_BAND).assignments
        verdicts[gpus] = (
            "new" in core_plan(engaged, None, predictor=predictor, settings=GANG_BAND).assignments,
            "new" in core_plan(engaged, None, predictor=predictor).assignments,
        )
    assert verdicts == {1: (True, True), 2: (False, True)}


def test_the_extender_view_applies_the_gangs_band(families):
    """Filter between epochs (PlacementView) refuses the gang the epoch refuses, naming
    the admission band, and admits the one-GPU job on the same prediction."""
    from elastico_extender.core.planner import PlacementView

    feasible = {}
    for gpus in (1, 2):
        snap, level, seen = gang_case(families, gpus)
        running = tuple(j for j in snap.jobs if j.id != "new")
        newcomer = next(j for j in snap.jobs if j.id == "new")
        previous = core_plan(replace(snap, jobs=running), None, predictor=Constant(1.0))
        for observed in ({}, seen):
            view = PlacementView(
                replace(snap, jobs=running, observed=observed),
                previous,
                settings=GANG_BAND,
                predictor=Constant(level),
            )
            verdict = view.evaluate(newcomer, families["resnet50"])["node-0"]
            feasible[gpus, bool(observed)] = verdict.feasible
    assert feasible == {(1, False): True, (1, True): True, (2, False): True, (2, True): False}
    assert "admission band" in verdict.reason


def test_a_borrowed_reference_widens_the_evidence_by_its_own_error():
    """Harm evidence: a solo reference as measured, a family's by 5%, a profile's by 10%."""
    from elastico_extender.core.observations import ObservedSlowdown
    from elastico_extender.core.planner.protect import (
        FAMILY_MARGIN,
        PROFILE_MARGIN,
        harm_evidence,
    )

    windows = (1.4, 1.4, 1.4, 1.4)
    evidence = {
        kind: harm_evidence(ObservedSlowdown(1.4, 4, 100.0, windows, ("p",), kind), 100.0)
        for kind in ("solo", "family", "profile")
    }
    assert evidence["solo"] == 1.4
    assert evidence["family"] == 1.4 * (1 + FAMILY_MARGIN)
    assert evidence["profile"] == 1.4 * (1 + PROFILE_MARGIN)
    # A family-referenced pair admitted inside the 5% band stays below tau = 1.5 ...
    assert evidence["family"] < 1.5 < evidence["profile"]  # ... a profile's error does not


def test_one_window_must_clear_the_noise_and_the_reference_error():
    """The one-window rule: 9% above tau for a job's own solo reference, and on top of that
    its reference's margin for a borrowed one (the window may be that far off)."""
    from elastico_extender.core.observations import ObservedSlowdown
    from elastico_extender.core.planner.protect import (
        FAMILY_MARGIN,
        ONE_WINDOW_MARGIN,
        PROFILE_MARGIN,
        harm_evidence,
    )

    def evidence(window: float, kind: str) -> float | None:
        return harm_evidence(ObservedSlowdown(window, 1, 100.0, (window,), ("p",), kind), 100.0)

    assert evidence(1.0, "solo") == pytest.approx(1.0 / (1 + ONE_WINDOW_MARGIN))
    tau = 1.5
    just_solo = tau * (1 + ONE_WINDOW_MARGIN) * 1.01
    assert evidence(just_solo, "solo") > tau  # beyond one window's noise
    assert evidence(just_solo, "family") < tau < evidence(just_solo * (1 + FAMILY_MARGIN), "family")
    assert evidence(just_solo * (1 + FAMILY_MARGIN), "profile") < tau
    assert evidence(just_solo * (1 + PROFILE_MARGIN), "profile") > tau
    # without a partner in the newest window there is no case at all
    assert harm_evidence(ObservedSlowdown(3.0, 1, 100.0, (3.0,), (), "solo"), 100.0) is None


def test_a_pair_that_cannot_be_measured_splits_when_a_gpu_is_idle(families):
    """Neither job has a reference (launch rates, family never seen alone): nobody knows
    whether the pair hurts, so one runs alone for a window that measures it."""
    snapshot = shared_pair(families, gpus=2)
    assert devices_of(plan(snapshot))["bert"] == devices_of(plan(snapshot))["resnet"]
    blind = replace(snapshot, unmeasured={"bert": 5.0, "resnet": 5.0}, now=10.0)
    result = plan(blind)
    assert devices_of(result)["bert"] != devices_of(result)["resnet"]
    # an agent that stopped reporting leaves the last decision in place
    stale = replace(blind, now=10_000.0)
    assert devices_of(plan(stale))["bert"] == devices_of(plan(stale))["resnet"]


def test_nobody_joins_a_pair_that_cannot_be_measured(families):
    """No idle GPU: the unmeasured pair stays, and a newcomer that would share waits."""
    snapshot = shared_pair(families, gpus=1)
    first = plan(snapshot)
    bert = first.assignments["bert"]
    jobs = (
        Job("bert", "bert", current_config=bert.config_index, devices=bert.devices),
        Job("lstm", "lstm", arrival_time=20.0),
    )
    alone = Snapshot(snapshot.nodes, jobs, families, epoch=2)
    assert "lstm" in plan(alone).assignments  # the blind predictor lets it share
    blind = replace(alone, unmeasured={"bert": 5.0}, now=10.0)
    result = plan(blind)
    assert "bert" in result.assignments and "lstm" not in result.assignments


def test_a_step_down_must_clear_the_evidence_not_the_lagging_average(families):
    """The pair ran fine, then two windows at 1.7x: harmed.  Its smoothed slowdown still
    lags near 1.25x, within tau: a step-down judged on that would keep a pair sharing
    that the windows say is 1.7x.  Judged on the evidence, no step-down is safe, and
    with no other GPU the newer job goes back to the queue."""
    snapshot = shared_pair(families, gpus=1)
    book = ObservationBook(smoothing=0.2)
    slowdowns = [1.0] * 4 + [1.7] * HARM_WINDOWS
    for k, s in enumerate(slowdowns, start=1):
        observe(book, snapshot, slowdown=s, end=k * WINDOW_S)
    seen = book.observed()
    assert seen["bert"].slowdown < 1.3  # the average lags behind the windows
    now = len(slowdowns) * WINDOW_S
    result = plan(replace(snapshot, observed=seen, now=now))
    actions = {p[2] for p in result.protections}
    assert actions and "step-down" not in actions, result.protections
    assert "resnet" in result.preempted


class _MemoryBound:
    """Slowdown grows steeply with the pair's GPU memory (fb_used_gib of both blocks), set
    to ``at_current`` for the pair as it runs: a leaner configuration looks safe."""

    name = "memory-bound"
    victim_fb = JOB_FEATURES.index("fb_used_gib")
    partner_fb = NUM_JOB_FEATURES + victim_fb

    def __init__(self, current_gib: float, at_current: float) -> None:
        self.current_gib, self.at_current = current_gib, at_current

    def predict(self, x: np.ndarray) -> np.ndarray:
        gib = x[:, self.victim_fb] + x[:, self.partner_fb]
        return 1.0 + (self.at_current - 1.0) * (gib / self.current_gib) ** 8


class _MemoryBoundObserved(_MemoryBound):
    """The same answers, each backed by observed windows of the configuration pair."""

    def observed_windows(self, x: np.ndarray) -> np.ndarray:
        return np.full(x.shape[0], float(HARM_WINDOWS))


@pytest.mark.parametrize("observed", [False, True])
def test_a_step_down_for_observed_harm_needs_observation_behind_it(families, observed):
    """Observed harm is remedied by what observation vouches for: a step-down only a
    prediction calls safe is no remedy (at load 1.5 a third of those left the pair above
    tau for another epoch or more), so with no other GPU the newer job is requeued; the
    same step-down backed by observed windows of the leaner pair is taken."""
    snapshot = shared_pair(families, gpus=1)
    book = ObservationBook(smoothing=1.0)
    seen_alone(book, snapshot)
    bert, resnet = (j for j in snapshot.jobs if j.id in ("bert", "resnet"))
    for k in range(1, HARM_WINDOWS + 1):  # bert is harmed, resnet is not
        for job, other, rate in ((bert, resnet, 100.0 / 1.7), (resnet, bert, 100.0)):
            window = Observation(job.id, job.current_config, k * WINDOW_S, WINDOW_S, rate)
            book.record(replace(window, partners=(other.id,)))
    gib = float(
        families[bert.family].features[bert.current_config][_MemoryBound.victim_fb]
        + families[resnet.family].features[resnet.current_config][_MemoryBound.victim_fb]
    )
    kind = _MemoryBoundObserved if observed else _MemoryBound
    predictor = kind(gib, at_current=1.7)
    now = HARM_WINDOWS * WINDOW_S
    result = core_plan(
        replace(snapshot, observed=book.observed(), now=now), None, predictor=predictor
    )
    actions = {p[2] for p in result.protections}
    if observed:
        assert actions == {"step-down"}, result.protections
        assert not result.preempted
    else:
        assert actions and "step-down" not in actions, result.protections
        assert "resnet" in result.preempted


def test_a_requeued_victim_is_held_apart_from_every_partner_it_had(families):
    """A multi-GPU job's window is one slowdown over all its devices' partners: which of
    them hurt it is unknown, so requeueing it holds it apart from each, not only from
    the partner whose pair the loop happened to look at first (on 64 GPUs an 8-GPU
    job went back next to the same partners two epochs later, twice)."""
    nodes = a100_nodes(1, 2)
    jobs = (
        Job("bert", "bert", current_config=0, devices=(("node-0", 0),), arrival_time=0.0),
        Job("dcgan", "dcgan", current_config=0, devices=(("node-0", 1),), arrival_time=0.0),
        Job(
            "resnet",
            "resnet50",
            gpus=2,
            current_config=0,
            devices=(("node-0", 0), ("node-0", 1)),
            arrival_time=10.0,
        ),
    )
    snapshot = Snapshot(nodes, jobs, families, epoch=1)
    book = ObservationBook(smoothing=1.0)
    seen_alone(book, snapshot)
    for k in range(1, HARM_WINDOWS + 1):
        observe(book, snapshot, slowdown=3.0, end=k * WINDOW_S)
    result = plan(replace(snapshot, observed=book.observed(), now=HARM_WINDOWS * WINDOW_S))
    assert "resnet" in result.preempted
    held = {frozenset(pair) for pair in result.separated}
    assert held >= {frozenset(("bert", "resnet")), frozenset(("dcgan", "resnet"))}
    # bert finishes: GPU 0 is idle, dcgan runs on GPU 1.  resnet needs both GPUs and
    # would share GPU 1 with dcgan again, but that pair is held apart too.
    dcgan = result.assignments["dcgan"]
    later = Snapshot(
        nodes,
        (
            Job("dcgan", "dcgan", current_config=dcgan.config_index, devices=dcgan.devices),
            Job("resnet", "resnet50", gpus=2, arrival_time=10.0),
        ),
        families,
        epoch=5,
    )
    assert "resnet" in plan(later).assignments  # without the loop's memory it would share
    assert "resnet" in plan(later, result).queued


def test_a_pair_stepped_down_for_one_harmed_tenant_is_not_separated_for_the_other(families):
    """Both tenants harmed: the step-down taken for the first was judged, with observation
    behind it, safe in both directions, so it answers the second tenant's case too.
    Before, the second tenant's turn found the pair already stepped down (a pair steps
    down once) and requeued the newer job in the same plan: a switch paid for nothing."""
    snapshot = shared_pair(families, gpus=1)
    book = ObservationBook(smoothing=1.0)
    seen_alone(book, snapshot)
    for k in range(1, HARM_WINDOWS + 1):
        observe(book, snapshot, slowdown=1.7, end=k * WINDOW_S)
    bert, resnet = (j for j in snapshot.jobs if j.id in ("bert", "resnet"))
    gib = float(
        families[bert.family].features[bert.current_config][_MemoryBound.victim_fb]
        + families[resnet.family].features[resnet.current_config][_MemoryBound.victim_fb]
    )
    now = HARM_WINDOWS * WINDOW_S
    result = core_plan(
        replace(snapshot, observed=book.observed(), now=now),
        None,
        predictor=_MemoryBoundObserved(gib, at_current=1.7),
    )
    assert [p[2] for p in result.protections] == ["step-down"], result.protections
    assert not result.preempted
    assert devices_of(result)["bert"] == devices_of(result)["resnet"]


def busy_previous(snapshot: Snapshot, utilization: float, seconds_ago: float) -> Plan:
    """The last plan, made ``seconds_ago`` under offered load ``utilization`` (a long queue)."""
    last = plan(snapshot)
    return replace(
        last,
        utilization=utilization,
        planned_at=snapshot.now - seconds_ago,
        utilization_history_s=3600.0,
    )


def test_tau_follows_the_load_smoothed_over_time_not_each_plan(families):
    """U(t) is averaged over ``utilization_smoothing_s``: a minute after a long queue
    cleared, tau is still the busy cluster's; with smoothing off it drops at once."""
    from elastico_extender.core.settings import PlannerSettings

    snapshot = replace(shared_pair(families, gpus=2), now=1000.0)
    calm = plan(snapshot).assignments["bert"].tolerance
    previous = busy_previous(snapshot, utilization=3.0, seconds_ago=60.0)
    busy = plan(snapshot, previous)
    assert busy.utilization is not None and busy.utilization > 2.9
    assert busy.planned_at == 1000.0
    assert busy.assignments["bert"].tolerance == pytest.approx(1.8)
    assert calm < 1.8 - 0.1
    off = core_plan(
        snapshot, previous, predictor=BLIND, settings=PlannerSettings(utilization_smoothing_s=0)
    )
    assert off.assignments["bert"].tolerance == pytest.approx(calm)


def test_a_pair_within_the_smoothed_tau_is_not_separated_when_the_queue_clears(families):
    """A pair observed above the instantaneous tau but within the smoothed one stays:
    one departure does not requeue a job the queue's length let share (with the
    instantaneous U the same windows separate it)."""
    from elastico_extender.core.settings import PlannerSettings

    snapshot = shared_pair(families, gpus=1)
    calm = plan(snapshot).assignments["bert"].tolerance
    book = ObservationBook(smoothing=1.0)
    seen_alone(book, snapshot)
    slowdown = (calm + 1.8) / 2.0
    for k in range(1, HARM_WINDOWS + 2):
        observe(book, snapshot, slowdown=slowdown, end=k * WINDOW_S)
    now = (HARM_WINDOWS + 1) * WINDOW_S
    snap = replace(snapshot, observed=book.observed(), now=now)
    previous = busy_previous(snap, utilization=3.0, seconds_ago=60.0)
    kept = plan(snap, previous)
    assert kept.protections == () and set(kept.assignments) == {"bert", "resnet"}
    settings = PlannerSettings(utilization_smoothing_s=0)
    split = core_plan(snap, previous, predictor=BLIND, settings=settings)
    assert split.protections and "resnet" in split.preempted


def test_a_first_plan_on_an_empty_view_does_not_hold_tau_down(families):
    """A restarted extender plans before its watch lists the pods: that plan's empty
    cluster (U = 0) is a history of no length and weighs nothing a second later."""
    snapshot = replace(shared_pair(families, gpus=2), now=1000.0)
    alone = plan(snapshot).assignments["bert"].tolerance
    empty = plan(replace(snapshot, jobs=(), now=999.0))
    assert empty.utilization == 0.0 and empty.utilization_history_s == 0.0
    after = plan(snapshot, empty)
    assert after.assignments["bert"].tolerance == pytest.approx(alone)
    assert after.utilization_history_s == 1.0


def harmed(families, gpus: int, pinned: tuple[str, ...]) -> Plan:
    """The plan after bert and resnet were seen at 3x for k windows on one GPU of a node
    with ``gpus``, the ``pinned`` jobs marked not preemptible (the driver cannot stop them)."""
    snapshot = shared_pair(families, gpus=gpus)
    jobs = tuple(replace(j, preemptible=j.id not in pinned) for j in snapshot.jobs)
    snapshot = replace(snapshot, jobs=jobs)
    book = ObservationBook(smoothing=1.0)
    for k in range(1, HARM_WINDOWS + 1):
        observe(book, snapshot, slowdown=3.0, end=k * WINDOW_S)
    return plan(replace(snapshot, observed=book.observed(), now=HARM_WINDOWS * WINDOW_S))


def test_the_tenant_that_leaves_a_harmful_pair_is_one_the_driver_can_stop(families):
    """Moving or requeueing a job the driver cannot stop (a pod that does not allow
    migration) separates nothing: the other tenant leaves instead, and when neither can,
    the pair stays together rather than being planned apart in vain."""
    assert harmed(families, 1, ()).preempted == ("resnet",)  # the newer, by default
    requeued = harmed(families, 1, ("resnet",))
    assert requeued.preempted == ("bert",) and set(requeued.assignments) == {"resnet"}
    moved = harmed(families, 2, ("resnet",))
    assert moved.assignments["resnet"].devices == (("node-0", 0),)
    assert moved.assignments["bert"].devices == (("node-0", 1),)
    stuck = harmed(families, 1, ("bert", "resnet"))
    assert stuck.preempted == () and stuck.separated == ()
    assert devices_of(stuck)["bert"] == devices_of(stuck)["resnet"] == (("node-0", 0),)
