"""Band preemption (planner.preempt, ``PlannerSettings.band_preemption``, on by default):
a queued job of a better length band stops a running job of a worse one, only across
bands, only after a minimum run, only a job never stopped before, only where the
estimate does not say the victim is nearly as short, and only when the queued job fits
nowhere else."""

from __future__ import annotations

from dataclasses import replace

from conftest import a100_nodes

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.settings import PlannerSettings

HOUR = 3600.0
NOW = 10 * HOUR
ON = PlannerSettings()
OFF = PlannerSettings(band_preemption=False)


def _full_cluster(families, family="bert", gpus=2, **running):
    """``gpus`` one-GPU jobs of ``family`` running for 9 h (9 GPU-hours: band 2 of 0-3),
    never stopped, and one job that arrived a minute ago with no service (band 0)."""
    fields = {"started_at": HOUR, **running}
    jobs = tuple(
        Job(f"long-{g}", family, current_config=0, devices=(("node-0", g),), **fields)
        for g in range(gpus)
    )
    fresh = Job("fresh", family, arrival_time=NOW - 60.0)
    return Snapshot(a100_nodes(1, gpus), (*jobs, fresh), families, now=NOW)


def test_a_queued_first_band_job_preempts_one_last_band_job(families):
    snap = _full_cluster(families)
    assert plan(snap, settings=OFF).preempted == ()  # off: it waits
    result = plan(snap)  # the default
    assert len(result.preempted) == 1 and result.preempted[0].startswith("long-")
    assert "fresh" in result.assignments
    assert result.stats["band_preemptions"] == 1.0
    (kept,) = {"long-0", "long-1"} - set(result.preempted)
    assert kept in result.assignments  # one victim is enough


def _with_estimates(families, remaining_h, fresh_h):
    """Two jobs that ran 9 h (band 2 of attained service) expected to run ``remaining_h``
    more, and a fresh job expected to run ``fresh_h``."""
    snap = _full_cluster(families, expected_duration_s=(9 + remaining_h) * HOUR)
    fresh = replace(snap.jobs[-1], expected_duration_s=fresh_h * HOUR)
    return replace(snap, jobs=(*snap.jobs[:-1], fresh))


def test_attained_service_decides_and_the_estimate_may_veto(families):
    """A fresh job expected to run 2 h preempts a job that has run 9 h and is expected to
    run 20 h more; but a job expected to finish in half an hour is not stopped for one
    expected to run 5 h."""
    assert len(plan(_with_estimates(families, 20.0, 2.0), settings=ON).preempted) == 1
    assert plan(_with_estimates(families, 0.5, 5.0), settings=ON).preempted == ()


def test_a_long_job_is_not_preempted_for_one_about_as_long(families):
    """Both expected to run about 20 h more: stopping the one that has run only moves the
    wait onto it (on Philly 0e4a51 at 256 GPUs, 48-hour jobs preempted so for a burst
    of newcomers waited 12 h more: p99 JCT 48.4 -> 58.7 h, the average no better).  The
    estimate must say the victim runs ``preemption_remaining_ratio`` times longer."""
    snap = _with_estimates(families, 20.0, 20.0)
    assert plan(snap, settings=ON).preempted == ()
    assert plan(_with_estimates(families, 20.0, 4.0), settings=ON).preempted != ()  # 5x
    assert plan(_with_estimates(families, 20.0, 6.0), settings=ON).preempted == ()  # 3.3x
    relaxed = replace(ON, preemption_remaining_ratio=3.0)
    assert plan(_with_estimates(families, 20.0, 6.0), settings=relaxed).preempted != ()


def test_the_remaining_ratio_must_be_at_least_one():
    problems = PlannerSettings(preemption_remaining_ratio=0.5).problems()
    assert any("preemption_remaining_ratio" in p for p in problems)


def test_no_preemption_within_a_band(families):
    snap = _full_cluster(families)
    served = replace(snap.jobs[-1], attained_gpu_seconds=9 * HOUR)  # requeued, as long
    result = plan(replace(snap, jobs=(*snap.jobs[:-1], served)), settings=ON)
    assert result.preempted == () and "fresh" in result.queued


def test_a_job_that_just_started_is_not_preempted(families):
    """A 4-GPU job 20 minutes into its run (1.3 GPU-hours: band 1) has not yet made
    ``preemption_min_run_s`` of progress."""
    node = "node-0"
    wide = Job(
        "wide", "bert", gpus=4, current_config=0, devices=tuple((node, g) for g in range(4)),
        started_at=NOW - 1200.0,
    )  # fmt: skip
    fresh = Job("fresh", "bert", arrival_time=NOW - 60.0)
    recent = Snapshot(a100_nodes(1, 4), (wide, fresh), families, now=NOW)
    assert plan(recent, settings=ON).preempted == ()
    assert plan(recent, settings=replace(ON, preemption_min_run_s=600.0)).preempted == ("wide",)


def test_a_job_that_can_share_preempts_nobody(families):
    snap = _full_cluster(families, family="resnet50")
    result = plan(snap, settings=ON)
    assert result.preempted == () and "fresh" in result.assignments


def test_a_heavier_user_weight_is_not_preempted_by_a_lighter_one(families):
    assert plan(_full_cluster(families, weight=2.0), settings=ON).preempted == ()


def test_a_one_gpu_job_preempts_a_one_gpu_victim_before_a_gang(families):
    node = "node-0"
    # 6 GPU-hours: band 2, as the single job's 9
    gang = Job(
        "gang", "bert", gpus=2, current_config=0, devices=((node, 0), (node, 1)),
        started_at=NOW - 3 * HOUR,
    )  # fmt: skip
    single = Job("single", "bert", current_config=0, devices=((node, 2),), started_at=HOUR)
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


def test_a_job_stopped_before_is_not_preempted_again(families):
    """A victim waits behind the queue it made room for; stopping it a second time is
    what lengthened the tail (p99 JCT) on Philly.  Service from an earlier run marks a
    job preempted or requeued before; the job never stopped is taken instead."""
    snap = _full_cluster(families)
    stopped = replace(snap.jobs[0], attained_gpu_seconds=2 * HOUR, started_at=NOW - 2 * HOUR)
    assert plan(replace(snap, jobs=(stopped, *snap.jobs[1:]))).preempted == ("long-1",)
    twice = replace(snap.jobs[1], attained_gpu_seconds=2 * HOUR)
    assert plan(replace(snap, jobs=(stopped, twice, snap.jobs[-1]))).preempted == ()


def test_a_job_that_may_not_be_stopped_is_never_a_victim(families):
    """``Job.preemptible`` False (in a cluster: a pod nothing would evict) takes the job
    out of the victims: the preemptible one is stopped instead, or none at all."""
    snap = _full_cluster(families)
    pinned = replace(snap.jobs[0], preemptible=False)
    assert plan(replace(snap, jobs=(pinned, *snap.jobs[1:]))).preempted == ("long-1",)
    both = (pinned, replace(snap.jobs[1], preemptible=False), snap.jobs[-1])
    result = plan(replace(snap, jobs=both))
    assert result.preempted == () and "fresh" in result.queued
    assert set(result.assignments) == {"long-0", "long-1"}
