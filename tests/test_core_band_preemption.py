"""Band preemption (planner.preempt, ``PlannerSettings.band_preemption``, off by default):
a queued job of a better length band stops a running job of a worse one, only across
bands, only after a minimum run, and only when the queued job fits nowhere else."""

from __future__ import annotations

from dataclasses import replace

from conftest import a100_nodes

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.settings import PlannerSettings

HOUR = 3600.0
NOW = 10 * HOUR
ON = PlannerSettings(band_preemption=True)


def _full_cluster(families, family="bert", gpus=2, **running):
    """``gpus`` one-GPU jobs of ``family`` running for 9 h after 20 GPU-hours of service
    (the last band), and one job that arrived a minute ago with none (the first band)."""
    fields = {"started_at": HOUR, "attained_gpu_seconds": 20 * HOUR, **running}
    jobs = tuple(
        Job(f"long-{g}", family, current_config=0, devices=(("node-0", g),), **fields)
        for g in range(gpus)
    )
    fresh = Job("fresh", family, arrival_time=NOW - 60.0)
    return Snapshot(a100_nodes(1, gpus), (*jobs, fresh), families, now=NOW)


def test_a_queued_first_band_job_preempts_one_last_band_job(families):
    snap = _full_cluster(families)
    assert plan(snap).preempted == ()  # off by default: it waits
    result = plan(snap, settings=ON)
    assert len(result.preempted) == 1 and result.preempted[0].startswith("long-")
    assert "fresh" in result.assignments
    assert result.stats["band_preemptions"] == 1.0
    (kept,) = {"long-0", "long-1"} - set(result.preempted)
    assert kept in result.assignments  # one victim is enough


def _with_estimates(families, remaining_h, fresh_h):
    """Two jobs that ran 9 h (band 2 of attained service) expected to run ``remaining_h``
    more, and a fresh job expected to run ``fresh_h``."""
    snap = _full_cluster(
        families, expected_duration_s=(9 + remaining_h) * HOUR, attained_gpu_seconds=0.0
    )
    fresh = replace(snap.jobs[-1], expected_duration_s=fresh_h * HOUR)
    return replace(snap, jobs=(*snap.jobs[:-1], fresh))


def test_attained_service_decides_and_the_estimate_may_veto(families):
    """A fresh job preempts a job that has run for hours even where both are expected to
    run long (one band of expected remaining time: the bursts of 4-GPU jobs on Philly VC
    11cb48 waited a day behind such jobs); but a job expected to finish in half an hour
    is not stopped for one expected to run 5 h."""
    assert len(plan(_with_estimates(families, 20.0, 20.0), settings=ON).preempted) == 1
    assert plan(_with_estimates(families, 0.5, 5.0), settings=ON).preempted == ()


def test_no_preemption_within_a_band(families):
    snap = _full_cluster(families)
    served = replace(snap.jobs[-1], attained_gpu_seconds=20 * HOUR)  # requeued long job
    result = plan(replace(snap, jobs=(*snap.jobs[:-1], served)), settings=ON)
    assert result.preempted == () and "fresh" in result.queued


def test_a_job_that_just_restarted_is_not_preempted_again(families):
    recent = _full_cluster(families, started_at=NOW - 600.0)  # resumed 10 minutes ago
    assert plan(recent, settings=ON).preempted == ()
    assert plan(recent, settings=replace(ON, preemption_min_run_s=300.0)).preempted != ()


def test_a_job_that_can_share_preempts_nobody(families):
    snap = _full_cluster(families, family="resnet50")
    result = plan(snap, settings=ON)
    assert result.preempted == () and "fresh" in result.assignments


def test_a_heavier_user_weight_is_not_preempted_by_a_lighter_one(families):
    assert plan(_full_cluster(families, weight=2.0), settings=ON).preempted == ()


def test_a_one_gpu_job_preempts_a_one_gpu_victim_before_a_gang(families):
    node = "node-0"
    gang = Job(
        "gang", "bert", gpus=2, current_config=0, devices=((node, 0), (node, 1)),
        started_at=HOUR, attained_gpu_seconds=40 * HOUR,
    )  # fmt: skip
    single = Job(
        "single", "bert", current_config=0, devices=((node, 2),), started_at=HOUR,
        attained_gpu_seconds=20 * HOUR,
    )  # fmt: skip
    fresh = Job("fresh", "bert", arrival_time=NOW - 60.0)
    snap = Snapshot(a100_nodes(1, 3), (gang, single, fresh), families, now=NOW)
    assert plan(snap, settings=ON).preempted == ("single",)


def test_a_gang_preempts_as_many_victims_as_it_needs_or_none(families):
    snap = _full_cluster(families, gpus=3)
    wide = replace(snap.jobs[-1], gpus=2)
    result = plan(replace(snap, jobs=(*snap.jobs[:-1], wide)), settings=ON)
    assert len(result.preempted) == 2 and "fresh" in result.assignments
    # Too wide for the cluster's victims (one is protected by its fresh restart): none.
    jobs = (*snap.jobs[:-2], replace(snap.jobs[-2], started_at=NOW - 60.0), replace(wide, gpus=3))
    blocked = plan(replace(snap, jobs=jobs), settings=ON)
    assert blocked.preempted == () and set(blocked.assignments) == {"long-0", "long-1", "long-2"}
