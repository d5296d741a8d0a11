"""Each baseline's defining behaviour (docs/baselines.md): Lucid, Tiresias, SRTF (oracle)."""

from __future__ import annotations

import pytest

from elastico_extender.core.duration import CompletedJob
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.shapes.catalog import catalog_families
from elastico_extender.policies import make_policy
from elastico_extender.policies.ledger import ServiceLedger
from elastico_extender.policies.lucid import LucidPolicy, affinity_class
from elastico_extender.policies.srtf import SrtfOraclePolicy
from elastico_extender.policies.tiresias import TiresiasPolicy
from elastico_extender.sim.engine import ClusterSpec, Simulator
from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable

FAMS = catalog_families()
FREE = ContentionPredictor(sm_weight=0.0, dram_weight=0.0, pressure_weight=0.0)
"""Predicts no slowdown for any pair: every job is 'tiny' (class 0)."""
HARSH = ContentionPredictor(sm_weight=5.0, dram_weight=5.0)
"""Predicts heavy slowdown for every pair: every job is 'jumbo' (class 2)."""


def _snap(jobs: list[Job], gpus: int = 8, now: float = 0.0) -> Snapshot:
    return Snapshot(ClusterSpec(gpus=gpus).nodes(), tuple(jobs), FAMS, now=now)


def _job(i: int, family: str = "lstm", gpus: int = 1, dev: int | None = None, **kw: object) -> Job:
    extra: dict[str, object] = dict(kw)
    if dev is not None:
        extra["current_config"] = FAMS[family].fastest_index
        extra["devices"] = tuple(("node-0000", dev + k) for k in range(gpus))
    return Job(
        id=f"j{i}", family=family, kind=FAMS[family].kind, gpus=gpus, arrival_time=float(i), **extra
    )  # type: ignore[arg-type]


# -- Lucid ------------------------------------------------------------------------------
def test_lucid_affinity_classes_follow_its_speed_thresholds() -> None:
    assert [affinity_class(s) for s in (1.0, 0.95, 0.9, 0.85, 0.5)] == [0, 0, 1, 1, 2]
    lucid = LucidPolicy(predictor=HARSH)
    assert lucid.sharing_score(dict(FAMS), "lstm", 0, 39 * 1024.0) == 2
    assert LucidPolicy(predictor=FREE).sharing_score(dict(FAMS), "lstm", 0, 39 * 1024.0) == 0


def test_lucid_priority_is_learned_duration_times_gpus() -> None:
    history = [CompletedJob("ncf", 1, 600.0)] * 20 + [CompletedJob("bert", 1, 50_000.0)] * 20
    lucid = LucidPolicy(predictor=FREE, history=history)
    plan = lucid.plan(_snap([_job(0, "bert"), _job(1, "ncf")], gpus=1), None)
    assert set(plan.assignments) == {"j1"}  # the short family first, though it came later
    # Without history both look alike: arrival order.
    plan = LucidPolicy(predictor=FREE).plan(_snap([_job(0, "bert"), _job(1, "ncf")], gpus=1))
    assert set(plan.assignments) == {"j0"}


def test_lucid_learns_from_jobs_it_saw_complete() -> None:
    lucid = LucidPolicy(predictor=FREE)
    lucid.plan(_snap([_job(0, "ppo", dev=0)], gpus=1, now=0.0))
    lucid.plan(_snap([], gpus=1, now=7200.0))  # j0 finished after 2 h
    assert lucid.ledger.completed[-1].duration_s == pytest.approx(7200.0)
    lucid.plan(_snap([_job(5, "lstm")], gpus=1, now=7300.0))
    assert lucid.estimator.predict(_job(9, "ppo")) > lucid.estimator.predict(_job(9, "lstm")) * 0.99


def test_lucid_does_not_pack_while_idle_gpus_cover_the_queue() -> None:
    running = _job(0, "lstm", dev=0)
    plan = LucidPolicy(predictor=FREE).plan(_snap([running, _job(1, "lstm")], gpus=2))
    assert plan.assignments["j1"].devices != running.devices


def test_lucid_packs_compatible_jobs_when_the_queue_is_long() -> None:
    running = _job(0, "lstm", dev=0)
    plan = LucidPolicy(predictor=FREE).plan(_snap([running, _job(1, "lstm"), _job(2, "lstm")], 1))
    assert plan.assignments["j1"].devices == running.devices
    assert plan.queued == ("j2",)  # at most two jobs per GPU


def test_lucid_never_pairs_jumbo_jobs() -> None:
    running = _job(0, "lstm", dev=0)
    plan = LucidPolicy(predictor=HARSH).plan(_snap([running, _job(1, "lstm")], gpus=1))
    assert plan.queued == ("j1",)


def test_lucid_pairs_only_equal_gpu_counts() -> None:
    running = _job(0, "lstm", gpus=2, dev=0)
    plan = LucidPolicy(predictor=FREE).plan(_snap([running, _job(1, "lstm")], gpus=2))
    assert plan.queued == ("j1",)


def test_lucid_does_not_stack_a_long_job_on_a_short_one() -> None:
    history = [CompletedJob("ncf", 1, 600.0)] * 30 + [CompletedJob("lstm", 1, 60_000.0)] * 30
    running = _job(0, "ncf", dev=0)
    lucid = LucidPolicy(predictor=FREE, history=history)
    plan = lucid.plan(_snap([running, _job(1, "lstm")], gpus=1))
    assert plan.queued == ("j1",)
    lucid = LucidPolicy(predictor=FREE, history=history)
    plan = lucid.plan(_snap([_job(0, "lstm", dev=0), _job(1, "ncf")], gpus=1))
    assert "j1" in plan.assignments  # a short job may join a long one


def test_lucid_walk_continues_past_a_gang_that_cannot_start() -> None:
    # 6 GPUs, a 4-GPU job running: 2 idle, a 4-GPU job then a 1-GPU job waiting.
    jobs = [_job(0, "lstm", gpus=4, dev=0), _job(1, "lstm", gpus=4), _job(2, "lstm", gpus=1)]
    plan = LucidPolicy(predictor=HARSH).plan(_snap(jobs, gpus=6))
    assert "j2" in plan.assignments and "j1" in plan.queued


# -- Tiresias ---------------------------------------------------------------------------
def test_tiresias_demotes_by_gpu_time_and_preempts_for_a_fresh_job() -> None:
    tir = TiresiasPolicy(thresholds=(3600.0,))
    tir.plan(_snap([_job(0, "lstm", gpus=4, dev=0)], gpus=4, now=0.0))
    # 1000 s later the 4-GPU job has 4000 GPU-s: past the threshold, queue 1.
    snap = _snap([_job(0, "lstm", gpus=4, dev=0), _job(1, "lstm", gpus=4)], gpus=4, now=1000.0)
    plan = tir.plan(snap)
    assert tir.ledger.attained("j0") == pytest.approx(4000.0)
    assert plan.preempted == ("j0",) and "j1" in plan.assignments


def test_tiresias_is_fifo_within_a_queue() -> None:
    tir = TiresiasPolicy(thresholds=(3600.0,))
    tir.plan(_snap([_job(0, "lstm", gpus=1, dev=0)], gpus=1, now=0.0))
    plan = tir.plan(_snap([_job(0, "lstm", dev=0), _job(1, "lstm")], gpus=1, now=1000.0))
    assert plan.preempted == () and plan.queued == ("j1",)  # 1000 GPU-s: still queue 0


def test_tiresias_keeps_running_jobs_ahead_of_waiting_ones_in_a_queue() -> None:
    """Tiresias' simulator moves a queue's waiting jobs behind its running ones after every
    pass: a gang that arrived first but did not fit does not preempt the job that backfilled."""
    tir = TiresiasPolicy()
    jobs = [_job(0, "lstm", dev=0), _job(1, "lstm", gpus=2), _job(2, "lstm")]
    plan = tir.plan(_snap(jobs, gpus=2, now=0.0))
    assert "j2" in plan.assignments and plan.queued == ("j1",)  # j2 backfills beside j0
    # j0 finished: j1 (2 GPUs, earlier arrival) waits for j2 instead of preempting it.
    assert plan.assignments["j2"].devices == (("node-0000", 1),)
    plan = tir.plan(_snap([_job(1, "lstm", gpus=2), _job(2, "lstm", dev=1)], gpus=2, now=600.0))
    assert plan.preempted == () and plan.queued == ("j1",)


def test_tiresias_promoted_job_keeps_the_top_queue_once_it_runs() -> None:
    """The starvation guard: a job promoted after waiting ``promote_factor`` times its
    executed time starts over in the top queue (Tiresias resets its service), so the next
    fresh arrival does not preempt it at once (a promote/preempt loop)."""
    tir = TiresiasPolicy(thresholds=(100.0,), promote_factor=1.0)
    tir.plan(_snap([_job(0, "lstm")], gpus=1, now=0.0))
    plan = tir.plan(_snap([_job(0, "lstm", dev=0), _job(1, "lstm")], gpus=1, now=200.0))
    assert plan.preempted == ("j0",)  # 200 GPU-s: j0 dropped to queue 1
    plan = tir.plan(_snap([_job(0, "lstm"), _job(1, "lstm", dev=0)], gpus=1, now=450.0))
    assert plan.preempted == ("j1",) and "j0" in plan.assignments  # waited 250 s >= 200 s
    jobs = [_job(0, "lstm", dev=0), _job(1, "lstm"), _job(455, "lstm")]
    plan = tir.plan(_snap(jobs, gpus=1, now=460.0))
    assert plan.preempted == () and "j0" in plan.assignments


def test_tiresias_asks_to_wake_at_the_next_demotion() -> None:
    tir = TiresiasPolicy(thresholds=(3600.0,))
    tir.plan(_snap([_job(0, "lstm", gpus=2, dev=0), _job(1, "lstm", gpus=2)], gpus=2, now=100.0))
    assert tir.wake_at() == pytest.approx(100.0 + 1800.0)


def test_tiresias_in_the_simulator_preempts_without_an_event() -> None:
    configs = ConfigTable.build(0, 0.0)
    truth = GroundTruth.build(configs, None)
    trace = [
        TraceJob("long", 0.0, 1, 20_000.0, "lstm"),
        TraceJob("short", 60.0, 1, 600.0, "lstm"),
    ]
    tir = TiresiasPolicy(thresholds=(1200.0,))
    result = Simulator(trace, tir, configs, truth, ClusterSpec(gpus=1)).run()
    finish = dict(zip([j.job_id for j in result.jobs], result.finish, strict=True))
    assert finish["short"] < 4000.0  # started once "long" passed 1200 GPU-s, not after it
    assert result.counters["preemptions"] >= 1


# -- SRTF (oracle) ----------------------------------------------------------------------
def test_srtf_preempts_for_a_shorter_remaining_time() -> None:
    remaining = {"j0": 50_000.0, "j1": 600.0}
    srtf = SrtfOraclePolicy(remaining=lambda job_id: remaining[job_id])
    plan = srtf.plan(_snap([_job(0, "lstm", dev=0), _job(1, "lstm")], gpus=1))
    assert plan.preempted == ("j0",) and "j1" in plan.assignments


def test_srtf_orders_by_remaining_gpu_time() -> None:
    """Tiresias' clairvoyant SRSF: two 1-GPU jobs of 1,200 s (1,200 GPU-s each) go before a
    2-GPU job of 1,000 s (2,000 GPU-s): average JCT 1,533 s instead of 1,800 s."""
    remaining = {"j0": 1000.0, "j1": 1200.0, "j2": 1200.0}
    srtf = SrtfOraclePolicy(remaining=lambda job_id: remaining[job_id])
    plan = srtf.plan(_snap([_job(0, "lstm", gpus=2), _job(1, "lstm"), _job(2, "lstm")], gpus=2))
    assert set(plan.assignments) == {"j1", "j2"} and plan.queued == ("j0",)


def test_srtf_refuses_without_its_oracle() -> None:
    with pytest.raises(ValueError, match="oracle"):
        make_policy("srtf").plan(_snap([_job(0, "lstm")], gpus=1))


def test_srtf_beats_fifo_on_a_head_of_line_trace() -> None:
    configs = ConfigTable.build(0, 0.0)
    truth = GroundTruth.build(configs, None)
    trace = [TraceJob("big", 0.0, 1, 30_000.0, "lstm")] + [
        TraceJob(f"s{k}", 30.0 + k, 1, 600.0, "lstm") for k in range(5)
    ]
    srtf = SrtfOraclePolicy()
    sim = Simulator(trace, srtf, configs, truth, ClusterSpec(gpus=1))
    srtf.remaining = sim.remaining_solo_s
    fast = sim.run()
    slow = Simulator(trace, make_policy("volcano"), configs, truth, ClusterSpec(gpus=1)).run()
    jct = lambda r: float((r.finish - r.arrival).mean())  # noqa: E731
    assert jct(fast) < 0.5 * jct(slow)


# -- the ledger both learn from ---------------------------------------------------------
def test_ledger_counts_gpu_seconds_and_observed_durations() -> None:
    ledger = ServiceLedger()
    ledger.observe(_snap([_job(0, "lstm", gpus=2, dev=0), _job(1, "ncf")], now=0.0))
    ledger.observe(_snap([_job(0, "lstm", gpus=2, dev=0), _job(1, "ncf")], now=100.0))
    assert ledger.attained("j0") == pytest.approx(200.0) and ledger.attained("j1") == 0.0
    ledger.observe(_snap([_job(1, "ncf")], now=500.0))
    assert list(ledger.completed) == [CompletedJob("lstm", 2, 500.0)]
    ledger.observe(_snap([], now=600.0))  # j1 never ran: not a completion
    assert len(ledger.completed) == 1


def test_lucid_classes_a_job_by_its_measured_solo_activity() -> None:
    """Lucid's profiler: a mostly idle job is tiny even if its family's profile is heavy."""
    learned = ContentionPredictor()
    fams = dict(FAMS)
    heavy = LucidPolicy(predictor=learned).sharing_score(fams, "lstm", 0, 39 * 1024.0, "j1")
    idle = LucidPolicy(predictor=learned, profiled=lambda job_id: (0.01, 0.0))
    assert idle.sharing_score(fams, "lstm", 0, 39 * 1024.0, "j1") < heavy
    assert idle.sharing_score(fams, "lstm", 0, 39 * 1024.0, "j1") == 0


# -- HAMi -------------------------------------------------------------------------------
def _big(jobs: list[Job], gpus: int = 1) -> Snapshot:
    """GPUs with memory for any number of jobs: only declared shares and counts bind."""
    nodes = ClusterSpec(gpus=gpus, device_mib=1024 * 1024.0).nodes()
    return Snapshot(nodes, tuple(jobs), FAMS, now=0.0)


def test_hami_packs_declared_shares_up_to_a_whole_gpu() -> None:
    """Three quarter-GPU jobs and one half-GPU job on one GPU with room for all in
    memory: the first three share it (0.75), the half does not fit beside them and
    waits; nothing about interference is asked."""
    hami = make_policy("hami", shares={"j0": 0.25, "j1": 0.25, "j2": 0.25, "j3": 0.5})
    plan = hami.plan(_big([_job(i, "ncf") for i in range(4)]))
    assert {j: a.devices for j, a in plan.assignments.items()} == {
        f"j{i}": (("node-0000", 0),) for i in range(3)
    }
    assert plan.queued == ("j3",)


def test_hami_spreads_over_gpus_of_the_fullest_node() -> None:
    """Node binpack, GPU spread (HAMi's chart defaults): the shared job goes to the node
    with the most share taken, and there to its emptiest GPU."""
    running = _job(0, "ncf", dev=0)  # half of node-0000's GPU 0
    hami = make_policy("hami", shares={"j0": 0.5, "j1": 0.3})
    plan = hami.plan(_big([running, _job(1, "ncf")], gpus=16))
    assert plan.assignments["j1"].devices == (("node-0000", 1),)  # not GPU 0, not node-0001


def test_hami_without_declared_shares_places_as_volcano() -> None:
    jobs = [_job(0, "lstm", dev=0), _job(1, "bert", gpus=2), _job(2, "ncf"), _job(3, "lstm")]
    ours = make_policy("hami").plan(_snap(jobs, gpus=4))
    fifo = make_policy("volcano").plan(_snap(jobs, gpus=4))
    assert {j: a.devices for j, a in ours.assignments.items()} == {
        j: a.devices for j, a in fifo.assignments.items()
    }
    assert ours.queued == fifo.queued


def test_hami_puts_at_most_ten_pods_on_a_gpu() -> None:
    shares = {f"j{i}": 0.01 for i in range(12)}
    plan = make_policy("hami", shares=shares).plan(_big([_job(i, "ncf") for i in range(12)]))
    assert len(plan.assignments) == 10 and plan.queued == ("j10", "j11")
