"""Quick simulator variant: small cluster, few jobs, every policy on the same seed.

Invariants: every job finishes, no device is ever over memory or SM capacity,
the work done equals the trace's work, held GPU-seconds match the device
timeline, and the core never drops a running job from a plan.
"""

from __future__ import annotations

import csv

import numpy as np
import pytest

from elastico_extender.sim.engine import DONE, ClusterSpec, RunResult
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import DEFAULT_POLICIES, Experiment, run_experiment
from elastico_extender.sim.traces import synthetic

GPUS = 16


@pytest.fixture(scope="module")
def runs() -> dict[str, RunResult]:
    trace = synthetic(GPUS, load=1.3, duration_s=3 * 3600.0, seed=3)
    exp = Experiment(trace=tuple(trace), cluster=ClusterSpec(gpus=GPUS), seed=3, epoch_s=60.0)
    return run_experiment(exp, (*DEFAULT_POLICIES, "elastico+iac"), workers=1)


def test_quick_trace_is_not_trivial(runs: dict[str, RunResult]) -> None:
    r = runs["volcano"]
    assert len(r.jobs) >= 15
    assert (r.gpus_of > 1).any()
    assert r.is_inference.any() and (~r.is_inference).any()


@pytest.mark.parametrize("policy", [*DEFAULT_POLICIES, "elastico+iac"])
def test_every_job_finishes_and_accounting_adds_up(runs: dict[str, RunResult], policy: str) -> None:
    r = runs[policy]
    assert (r.status == DONE).all(), r.anomalies
    assert not r.anomalies
    assert not r.capacity_violations
    s = summarise(r)
    assert s["work_error"] < 1e-6
    assert s["gpu_seconds_error"] < 1e-6
    assert np.all(r.first_start >= r.arrival - 1e-9)
    assert np.all(r.finish >= r.first_start + r.work * 0.5)
    # A job can never finish faster than its work at the fastest configuration (+noise).
    assert np.all(r.finish - r.first_start >= r.work * 0.8)
    # The busy-device share never exceeds the cluster.
    assert r.seg_busy.max() <= 1.0 + 1e-9
    assert r.seg_sm.max() <= 1.0 + 1e-9 and r.seg_mem.max() <= 1.0 + 1e-9


TIME_PARTS = (
    "avg_queue_s",
    "avg_waiting_after_start_s",
    "avg_paused_s",
    "avg_config_loss_s",
    "avg_interference_loss_s",
)


@pytest.mark.parametrize("policy", [*DEFAULT_POLICIES, "elastico+iac"])
def test_where_each_jobs_time_goes_adds_up_to_its_jct(
    runs: dict[str, RunResult], policy: str
) -> None:
    """JCT = solo run + queued + waiting after a preemption + paused + slower configuration
    + interference; the per-job records agree with the cluster timeline's."""
    r = runs[policy]
    s = summarise(r)
    parts = sum(s[k] for k in TIME_PARTS)
    assert s["avg_jct_s"] == pytest.approx(float(r.work.mean()) + parts, rel=1e-9)
    dt = r.seg_t1 - r.seg_t0
    # Two bookkeepings of the same thing: per job, and GPU-weighted per timeline segment.
    assert float((r.active_s * r.gpus_of).sum()) == pytest.approx(float((r.seg_active * dt).sum()))
    assert float((r.config_work_s * r.gpus_of).sum()) == pytest.approx(
        float((r.seg_cfg * dt).sum())
    )
    held = r.held_gpu_s / r.gpus_of
    assert np.all(r.active_s <= held + 1e-6)  # paused time is never negative
    assert np.all(r.finish - r.first_start >= held - 1e-6)  # nor waiting after a start
    # No job progresses faster than its configuration alone: interference never gains.
    assert np.all(r.config_work_s >= r.work - 1e-6 * np.maximum(r.work, 1.0))


def test_fifo_loses_time_only_to_the_queue(runs: dict[str, RunResult]) -> None:
    s = summarise(runs["volcano"])
    assert s["avg_queue_s"] > 0
    for key in TIME_PARTS[1:]:
        assert abs(s[key]) < 1e-6, key


def test_sharing_shows_its_interference(runs: dict[str, RunResult]) -> None:
    s = summarise(runs["elastico"])
    assert s["avg_interference_loss_s"] > 0
    assert s["avg_config_loss_s"] != 0.0  # RST reshapes jobs on this loaded cluster


def test_policies_share_the_same_trace(runs: dict[str, RunResult]) -> None:
    ref = runs["volcano"]
    for r in runs.values():
        assert [j.job_id for j in r.jobs] == [j.job_id for j in ref.jobs]
        np.testing.assert_array_equal(r.arrival, ref.arrival)
        np.testing.assert_array_equal(r.work, ref.work)
        assert float((r.work * r.gpus_of).sum()) == float((ref.work * ref.gpus_of).sum())


def test_volcano_never_shares_or_reshapes(runs: dict[str, RunResult]) -> None:
    r = runs["volcano"]
    assert r.counters["reconfigurations"] == 0
    assert r.counters["migrations"] == 0 and r.counters["preemptions"] == 0
    # Alone at its default configuration, a job runs exactly its trace duration.
    np.testing.assert_allclose(r.finish - r.first_start, r.work, rtol=1e-6, atol=1e-3)
    assert summarise(r)["attainment"] == 100.0


def test_no_reshape_ablation_never_reconfigures(runs: dict[str, RunResult]) -> None:
    assert runs["elastico-no-rst"].counters["reconfigurations"] == 0


def test_cli_quick_writes_tables(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from elastico_extender.sim.cli import main

    code = main(
        [
            "--quick",
            "--policy",
            "volcano",
            "--policy",
            "elastico",
            "--out",
            str(tmp_path),
            "--no-plots",
            "--no-progress",
            "--jobs",
            "1",
        ]
    )
    assert code == 0
    text = (tmp_path / "tables.md").read_text()
    assert "| volcano | 1.00x |" in text
    assert "## Where each job's time goes" in text
    volcano_parts = next(
        line for line in text.splitlines() if line.startswith("| volcano |") and "x" not in line
    )
    assert volcano_parts.endswith("| 0.0 | 0.0 | 0.0 | 0.0 |")  # FIFO only queues
    for name in ("summary.csv", "jobs.csv", "timeline.csv"):
        assert (tmp_path / name).stat().st_size > 0
    # Per job, the same split of its JCT (to find the one job a table's mean hides).
    with open(tmp_path / "jobs.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    parts = ("waiting_after_start_s", "paused_s", "config_loss_s", "interference_loss_s")
    for row in rows:
        total = sum(float(row[k]) for k in ("duration_s", "queue_s", *parts))
        assert total == pytest.approx(float(row["jct_s"]), abs=0.5), row
    assert any(float(row["interference_loss_s"]) > 1 for row in rows if row["policy"] == "elastico")


def test_without_interference_colocation_costs_nothing() -> None:
    """Experiment.interference = 0: the what-if ceiling of benchmarks/throughput_gap.py."""
    from elastico_extender.sim.runner import run_one

    trace = synthetic(8, load=1.5, duration_s=2 * 3600.0, seed=5)
    exp = Experiment(tuple(trace), ClusterSpec(gpus=8), seed=5, interference=0.0)
    r = run_one("lucid", exp)
    s = summarise(r)
    assert (r.status == DONE).all() and not r.capacity_violations
    assert np.any(r.seg_tenants > r.seg_busy * 8 + 1e-6)  # some device was shared
    assert s["interference_efficiency"] == pytest.approx(1.0)
    assert s["avg_interference_loss_s"] == pytest.approx(0.0, abs=1e-6)


class _Recording:
    """Volcano, noting every planned job's expected duration (what a length-aware
    planner would read)."""

    name = "recording"

    def __init__(self) -> None:
        from elastico_extender.policies import make_policy

        self.inner = make_policy("volcano")
        self.seen: dict[str, float] = {}

    def plan(self, snapshot, previous=None):  # type: ignore[no-untyped-def]
        for job in snapshot.jobs:
            self.seen.setdefault(job.id, job.expected_duration_s)
        return self.inner.plan(snapshot, previous)


@pytest.mark.parametrize("oracle", [False, True])
def test_oracle_durations_show_the_planner_every_true_duration(oracle: bool) -> None:
    """The ORACLE diagnostic (Experiment.oracle_durations) bounds what length awareness
    could gain; without it the planner sees only the estimator's guesses (0: none yet)."""
    from elastico_extender.sim.engine import Simulator
    from elastico_extender.sim.truth import GroundTruth
    from elastico_extender.sim.workloads import ConfigTable

    trace = synthetic(8, load=1.0, duration_s=3600.0, seed=2)[:6]
    configs = ConfigTable.build(0, 0.0)
    policy = _Recording()
    truth = GroundTruth.build(configs, None)
    Simulator(trace, policy, configs, truth, ClusterSpec(gpus=8), oracle_durations=oracle).run()
    truth_s = {j.job_id: j.duration_s for j in trace}
    assert set(policy.seen) == set(truth_s)
    if oracle:
        assert policy.seen == pytest.approx(truth_s)
    else:
        assert all(policy.seen[k] != pytest.approx(truth_s[k]) for k in truth_s)
        assert 0.0 in policy.seen.values()
