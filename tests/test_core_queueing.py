"""Length-aware queueing (issue 14): bands from attained service or expected remaining time,
floors and starvation promotion; the share-or-wait rule; and no harm at low load."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from conftest import a100_nodes

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.pricing.queueing import queue_weights, service_keys
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import InvalidSnapshotError

HOUR = 3600.0


def _weights(families, jobs, now, **settings):
    snap = Snapshot(a100_nodes(1, 8), tuple(jobs), families, now=now)
    return queue_weights(snap, snap.columns.weight, PlannerSettings(**settings))


def test_least_attained_service_without_history(families):
    node = "node-0"
    jobs = [
        Job("fresh", "bert", arrival_time=0.0),
        Job("served", "bert", attained_gpu_seconds=2 * HOUR, arrival_time=4.5 * HOUR),
        # Running for 5 h on 4 GPUs: 20 GPU-hours of service, the lowest band.
        Job(
            "long", "bert", gpus=4, current_config=0, started_at=0.0, arrival_time=0.0,
            devices=tuple((node, g) for g in range(4)),
        ),
    ]  # fmt: skip
    w = _weights(families, jobs, now=5 * HOUR)
    assert w[0] == 1.0 and w[1] == 0.5 and w[2] == 0.25
    assert _weights(families, jobs, 5 * HOUR, length_aware=False).tolist() == [1.0, 1.0, 1.0]


def test_expected_remaining_time_ranks_jobs_with_history(families):
    short = Job("short", "bert", expected_duration_s=0.5 * HOUR, arrival_time=10.0)
    long = Job("long", "bert", gpus=2, expected_duration_s=10 * HOUR, arrival_time=0.0)
    w = _weights(families, [long, short], now=20.0)
    assert w[1] > w[0]  # the short job goes first although it arrived later
    # A job that outlived its estimate is expected to run about as long again.
    snap = Snapshot(
        a100_nodes(1, 8),
        (Job("old", "bert", expected_duration_s=HOUR, attained_gpu_seconds=3 * HOUR),),
        families,
    )
    _, remaining = service_keys(snap)
    assert remaining[0] == pytest.approx(3 * HOUR)


def test_weight_floor_and_starvation_bound_how_long_a_job_waits(families):
    huge = Job("huge", "bert", expected_duration_s=1000 * HOUR, arrival_time=0.0)
    w = _weights(families, [huge], now=HOUR, weight_floor=0.3)
    assert w[0] == pytest.approx(0.3)  # never below the floor
    starved = _weights(families, [replace(huge, expected_duration_s=2 * HOUR)], now=5 * HOUR)
    assert starved[0] == 1.0  # waited more than 2x its expected run time: first band again


def test_shorter_expected_job_is_admitted_first_when_one_gpu_frees(families):
    jobs = (
        Job("long", "bert", expected_duration_s=20 * HOUR, arrival_time=0.0),
        Job("short", "bert", expected_duration_s=0.2 * HOUR, arrival_time=60.0),
    )
    snap = Snapshot(a100_nodes(1, 1), jobs, families, now=120.0)
    settings = PlannerSettings(reshape=False)  # one job per GPU
    assert set(plan(snap, settings=settings).assignments) == {"short"}
    fifo = replace(settings, length_aware=False)
    assert set(plan(snap, settings=fifo).assignments) == {"long"}


def test_admitted_jobs_are_packed_in_queue_order_before_size(families):
    """When the prices admit more than the devices hold, packing decides who starts: it
    took the users' weights and then the largest job first, so a long 2-GPU job went
    before a short one the length-aware queue ranks first (seen in the simulator:
    without sharing, ElastiCo's short jobs waited 4x longer than under Lucid)."""
    from elastico_extender.core.planner.epoch import packing_order
    from elastico_extender.core.planner.tables import build_tables

    jobs = (
        Job("long", "bert", gpus=2, expected_duration_s=20 * HOUR, arrival_time=0.0),
        Job("short", "bert", expected_duration_s=0.2 * HOUR, arrival_time=60.0),
        Job("short-later", "bert", expected_duration_s=0.2 * HOUR, arrival_time=90.0),
    )
    snap = Snapshot(a100_nodes(1, 8), jobs, families, now=120.0)
    settings = PlannerSettings()
    tables = build_tables(snap, settings)
    tables.rank = queue_weights(snap, tables.weight, settings)
    choice = np.zeros(len(jobs), dtype=np.intp)
    assert packing_order(tables, np.arange(3), choice) == [1, 2, 0]
    # without length awareness every rank is the weight: size first, as before
    tables.rank = None
    assert packing_order(tables, np.arange(3), choice) == [0, 1, 2]


def test_within_a_band_the_shorter_expected_job_is_packed_first(families):
    """Bands are coarse (a factor of 4 each): a 2-GPU job expected to need 0.9 GPU-hours
    and a 1-GPU job expected to need 0.5 share the first band.  Packing went by size
    within the band, so the longer job started first and the shorter one waited out its
    run; SRTF and Lucid order by the estimate itself."""
    from elastico_extender.core.planner.epoch import packing_order
    from elastico_extender.core.planner.tables import build_tables

    jobs = (
        Job("wide", "bert", gpus=2, expected_duration_s=0.45 * HOUR, arrival_time=0.0),
        Job("narrow", "bert", expected_duration_s=0.5 * HOUR, arrival_time=60.0),
    )
    snap = Snapshot(a100_nodes(1, 8), jobs, families, now=120.0)
    tables = build_tables(snap, PlannerSettings())
    tables.rank = queue_weights(snap, tables.weight, PlannerSettings())
    assert tables.rank[0] == tables.rank[1]  # one band
    tables.service_key = service_keys(snap)[0]
    choice = np.zeros(len(jobs), dtype=np.intp)
    assert packing_order(tables, np.arange(2), choice) == [1, 0]
    tables.service_key = None  # length-blind: size first, as before
    assert packing_order(tables, np.arange(2), choice) == [0, 1]


def test_bad_service_fields_are_refused_with_the_field_named(families):
    for bad in (
        {"attained_gpu_seconds": -1.0},
        {"expected_duration_s": float("nan")},
        {"started_at": float("inf")},
    ):
        snap = Snapshot(a100_nodes(1, 1), (Job("j", "bert", **bad),), families)
        with pytest.raises(InvalidSnapshotError, match=next(iter(bad))):
            plan(snap)


def _busy_gpu_and_a_queued_job(families, remaining_s, expected_s):
    """One GPU running a job expected to end in ``remaining_s``; a queued job fitting beside it."""
    running = Job(
        "running", "resnet50", current_config=0, devices=(("node-0", 0),), started_at=0.0,
        expected_duration_s=HOUR + remaining_s, attained_gpu_seconds=0.0,
    )  # fmt: skip
    queued = Job("queued", "dcgan", expected_duration_s=expected_s, arrival_time=HOUR)
    return Snapshot(a100_nodes(1, 1), (running, queued), families, now=HOUR)


def test_a_job_waits_for_a_gpu_about_to_free_instead_of_sharing(families):
    # Without an estimate the queued job shares the busy GPU (as before) ...
    share = plan(_busy_gpu_and_a_queued_job(families, 120.0, 0.0))
    assert "queued" in share.assignments
    assert share.assignments["queued"].predicted_slowdown > 1.0
    # ... with one, a 10 h job does not pay a slowdown to save two minutes of waiting,
    waits = plan(_busy_gpu_and_a_queued_job(families, 120.0, 10 * HOUR))
    assert "queued" in waits.queued
    assert "share-or-wait" in waits.queue_reasons["queued"]  # said why (REST, kubectl why)
    # but it does share when the GPU is not expected to free up for days.
    shares = plan(_busy_gpu_and_a_queued_job(families, 100 * HOUR, 10 * HOUR))
    assert "queued" in shares.assignments


def test_lightly_loaded_trace_runs_every_job_at_solo_speed():
    """Issue 14 section 4: at low load no job pays for sharing or a leaner configuration."""
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.runner import Experiment, run_one
    from elastico_extender.sim.traces import synthetic

    trace = synthetic(16, 0.3, 6 * HOUR, seed=1)
    exp = Experiment(tuple(trace), ClusterSpec(gpus=16), 1, epoch_s=10.0)
    r = run_one("elastico", exp)
    done = r.status == 3
    assert done.all()
    stretch = (r.finish - r.arrival)[done] / r.work[done]
    assert stretch.max() <= 1.05, np.sort(stretch)[-5:]


def test_the_simulated_elastico_starts_from_the_history_lucid_gets(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Jobs that finished before a trace window are what both policies know of lengths:
    the Lucid-like baseline's estimator starts from them, and so must the duration
    estimates ElastiCo's planner reads from its snapshot (they were ignored)."""
    from elastico_extender.core.duration import CompletedJob
    from elastico_extender.sim import runner
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.traces import TraceJob

    history = tuple(CompletedJob("lstm", 1, 7200.0) for _ in range(10))
    trace = (TraceJob("a", 0.0, 1, 600.0, "lstm"), TraceJob("b", 30.0, 1, 600.0, "lstm"))
    exp = runner.Experiment(trace=trace, cluster=ClusterSpec(gpus=1), history=history)
    seen: list[float] = []
    build = runner.build_policy

    def spying(name, exp, truth):  # type: ignore[no-untyped-def]
        policy = build(name, exp, truth)
        plan = policy.plan

        def watched(snapshot, previous=None):  # type: ignore[no-untyped-def]
            seen.extend(j.expected_duration_s for j in snapshot.jobs)
            return plan(snapshot, previous)

        policy.plan = watched
        return policy

    monkeypatch.setattr(runner, "build_policy", spying)
    runner.run_one("elastico", exp)
    assert seen and seen[0] == pytest.approx(7200.0, rel=0.3)


def test_a_job_queued_for_want_of_room_is_told_so(families):
    """Every queued job carries why it waits (``Plan.queue_reasons``): here no GPU has
    room for any allowed configuration beside the tenants already there (and the
    tenants started 10 minutes ago: band preemption may not stop them yet)."""
    node = "node-0"
    big = [
        Job(f"big{g}", "mistral-7b", current_config=0, started_at=HOUR - 600.0,
            devices=((node, g),))
        for g in range(2)
    ]  # fmt: skip
    pending = Job("late", "mistral-7b", arrival_time=HOUR)
    result = plan(Snapshot(a100_nodes(1, 2), (*big, pending), families, now=HOUR))
    assert "late" in result.queued
    assert "no GPU has room" in result.queue_reasons["late"]
    assert set(result.queue_reasons) == set(result.queued)
