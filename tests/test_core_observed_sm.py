"""Observed SM demand: running jobs observed long enough are charged their observed peak
SM activity (with a margin), not their catalog share; memory stays charged in full."""

from __future__ import annotations

from dataclasses import replace

from conftest import a100_nodes

from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import Job, Mode, Plan, Snapshot
from elastico_extender.core.observations import SM_HORIZON_S, Observation, ObservationBook
from elastico_extender.core.planner import PlacementView
from elastico_extender.core.planner import plan as core_plan
from elastico_extender.core.planner.observed_sm import SM_FLOOR, SM_MARGIN
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.settings import PlannerSettings

WINDOW_S = 300.0
BLIND = ContentionPredictor(sm_weight=0.0, dram_weight=0.0, pressure_weight=0.0)
"""Predicts no slowdown: the only thing that keeps a job off the GPU here is capacity."""
# Catalog rows chosen so that A + B + C exceed one GPU's SM (0.43 + 0.42 + 0.38 = 1.23)
# while their memory fits one A100-40GB (12.5 + 11.4 + 10.1 GB).
A = ("a", "resnet50", 19)
B = ("b", "dcgan", 18)
C = ("c", "dcgan", 19)


def plan(snapshot: Snapshot, **settings: bool) -> Plan:
    return core_plan(snapshot, predictor=BLIND, settings=PlannerSettings(**settings))


def fixed(spec: tuple[str, str, int], running: bool, arrival: float = 0.0) -> Job:
    job_id, family, config = spec
    return Job(
        job_id,
        family,
        mode=Mode.FIXED,
        allowed=(config,),
        current_config=config if running else None,
        devices=(("node-0", 0),) if running else (),
        arrival_time=arrival,
    )


def observe(book: ObservationBook, jobs: tuple[Job, ...], activity: dict[str, list[float]]):
    """Windows of WINDOW_S for each running job, no slowdown, the given SM activities."""
    running = [j for j in jobs if j.devices]
    end = 0.0
    for k in range(max(len(v) for v in activity.values())):
        end = (k + 1) * WINDOW_S
        for job in running:
            partners = tuple(o.id for o in running if o.id != job.id)
            book.set_reference(job.id, job.current_config, "launches/s", 100.0)
            book.record(
                Observation(
                    job.id,
                    job.current_config,
                    end,
                    WINDOW_S,
                    100.0,
                    partners=partners,
                    sm_activity=activity[job.id][k],
                )
            )
    return end


def two_running_one_waiting(families, activity, now_extra: float = 0.0, **settings: bool):
    jobs = (fixed(A, True), fixed(B, True), fixed(C, False, arrival=10.0))
    snapshot = Snapshot(a100_nodes(1, 1), jobs, families, epoch=1)
    book = ObservationBook()
    end = observe(book, jobs, activity)
    return plan(replace(snapshot, observed=book.observed(), now=end + now_extra), **settings)


def test_the_catalog_shares_do_not_fit_a_third_job(families):
    sm = sum(families[f].resources[c, GPU_SM] for _, f, c in (A, B, C))
    mem = sum(families[f].resources[c, GPU_MEM] for _, f, c in (A, B, C))
    assert sm > 1.0 and mem < 40 * 1024 - 512
    jobs = (fixed(A, True), fixed(B, True), fixed(C, False, arrival=10.0))
    result = plan(Snapshot(a100_nodes(1, 1), jobs, families, epoch=1))
    assert "c" in result.queued


def test_jobs_observed_at_ten_percent_make_room_for_a_third(families):
    result = two_running_one_waiting(families, {"a": [0.1] * 3, "b": [0.1] * 3})
    assert set(result.assignments) == {"a", "b", "c"}
    assert result.stats["sm_observed_jobs"] == 2.0
    # a and b are charged 1.25 x 0.1, c its catalog share.
    expected = 2 * SM_MARGIN * 0.1 + families["dcgan"].resources[19, GPU_SM]
    assert abs(result.stats["sm_allocated"] - expected) < 1e-6


def test_observed_sm_off_keeps_catalog_shares(families):
    result = two_running_one_waiting(families, {"a": [0.1] * 3, "b": [0.1] * 3}, observed_sm=False)
    assert "c" in result.queued


def test_a_burst_is_respected_not_averaged(families):
    # Means 0.14 and 0.13 would leave room for c (0.17 + 0.17 + 0.38); the peaks
    # (1.25 x 0.32 and 1.25 x 0.3, both below the catalog shares) do not.
    result = two_running_one_waiting(families, {"a": [0.05, 0.32, 0.05], "b": [0.05, 0.3, 0.05]})
    assert "c" in result.queued
    assert result.stats["sm_observed_jobs"] == 2.0
    assert abs(result.stats["sm_allocated"] - SM_MARGIN * (0.32 + 0.3)) < 1e-6


def test_stale_observations_fall_back_to_catalog_shares(families):
    result = two_running_one_waiting(
        families, {"a": [0.1] * 3, "b": [0.1] * 3}, now_extra=3 * WINDOW_S
    )
    assert "c" in result.queued and result.stats["sm_observed_jobs"] == 0.0


def test_too_little_evidence_keeps_the_catalog_share(families):
    result = two_running_one_waiting(families, {"a": [0.1], "b": [0.1]})  # 5 min < 10 min
    assert "c" in result.queued


def test_memory_is_never_overcommitted(families):
    # bert needs >= 22.8 GB: next to a (12.5 GB) and b (11.4 GB) it cannot fit,
    # however idle they are.
    jobs = (fixed(A, True), fixed(B, True), Job("big", "bert", arrival_time=10.0))
    snapshot = Snapshot(a100_nodes(1, 1), jobs, families, epoch=1)
    book = ObservationBook()
    end = observe(book, jobs, {"a": [0.0] * 3, "b": [0.0] * 3})
    result = plan(replace(snapshot, observed=book.observed(), now=end))
    assert "big" in result.queued
    assert result.stats["sm_observed_jobs"] == 2.0


def test_a_rising_share_keeps_tenants_in_place(families):
    # a, b and c share the GPU on the strength of low activity; c then turns busy:
    # charged its catalog share again, the shares sum above 1, nobody is preempted.
    jobs = (fixed(A, True), fixed(B, True), fixed(C, True, arrival=10.0))
    snapshot = Snapshot(a100_nodes(1, 1), jobs, families, epoch=2)
    book = ObservationBook()
    end = observe(book, jobs, {"a": [0.1] * 3, "b": [0.1] * 3, "c": [0.1, 0.1, 0.9]})
    result = plan(replace(snapshot, observed=book.observed(), now=end))
    assert set(result.assignments) == {"a", "b", "c"} and not result.preempted
    assert all(a.devices == (("node-0", 0),) for a in result.assignments.values())


def test_book_keeps_the_peak_of_the_last_hour_per_configuration():
    book = ObservationBook()
    book.set_reference("j", 0, "launches/s", 100.0)
    for k, activity in enumerate([0.1, 0.6, 0.1, 0.2]):
        book.record(Observation("j", 0, 60.0 * (k + 1), 60.0, 100.0, sm_activity=activity))
    seen = book.observed()["j"]
    assert seen.sm_peak == 0.6 and seen.sm_seconds == 240.0 and seen.sm_config == 0
    # An hour later the burst has aged out; the newest window is the peak.
    book.record(Observation("j", 0, 240.0 + SM_HORIZON_S, 60.0, 100.0, sm_activity=0.15))
    assert book.observed()["j"].sm_peak == 0.15
    # A configuration switch restarts the peak; a report without SM keeps what there is.
    book.set_reference("j", 1, "launches/s", 100.0)
    book.record(Observation("j", 1, 300.0 + SM_HORIZON_S, 60.0, 100.0, sm_activity=0.3))
    book.record(Observation("j", 1, 360.0 + SM_HORIZON_S, 60.0, 100.0))
    seen = book.observed()["j"]
    assert seen.sm_peak == 0.3 and seen.sm_config == 1 and seen.sm_seconds == 60.0
    assert len(seen.sm_buckets) <= 6  # bounded whatever the report period


def test_an_idle_job_is_charged_the_floor(families):
    result = two_running_one_waiting(families, {"a": [0.0] * 3, "b": [0.0] * 3})
    expected = 2 * SM_FLOOR + families["dcgan"].resources[19, GPU_SM]
    assert abs(result.stats["sm_allocated"] - expected) < 1e-6


def test_the_extender_view_charges_what_the_planner_charged(families):
    # Between epochs a new pod is placed on the view the last plan left; with a and b
    # observed at 10% it fits beside them there too (the planner would have agreed).
    jobs = (fixed(A, True), fixed(B, True))
    book = ObservationBook()
    end = observe(book, jobs, {"a": [0.1] * 3, "b": [0.1] * 3})
    snapshot = replace(
        Snapshot(a100_nodes(1, 1), jobs, families, epoch=1), observed=book.observed(), now=end
    )
    newcomer = fixed(C, False, arrival=10.0)
    for observed_sm in (True, False):
        settings = PlannerSettings(observed_sm=observed_sm)
        result = core_plan(snapshot, predictor=BLIND, settings=settings)
        view = PlacementView(snapshot, result, settings, BLIND)
        verdict = view.evaluate(newcomer, families["dcgan"])["node-0"]
        assert verdict.feasible == observed_sm, verdict.reason
