"""Every figure of the simulator's tables against a hand computation on tiny traces.

One or two GPUs, a few jobs with known arrivals and durations, no interference
table: what each metric should read can be worked out on paper.
"""

from __future__ import annotations

import pytest

from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_experiment
from elastico_extender.sim.traces import TraceJob


def _run(jobs: list[TraceJob], gpus: int, *policies: str) -> dict[str, RunResult]:
    exp = Experiment(trace=tuple(jobs), cluster=ClusterSpec(gpus=gpus), pairs=None)
    return run_experiment(exp, policies, workers=1)


def test_a_one_instant_window_averages_up_to_the_last_completion() -> None:
    """Jobs that all arrive at once have no arrival window: the averages cover the run,
    first arrival to last completion.  Before the fix they ran to the next epoch after
    it, so one job alone on one GPU read 99.2% busy and 0.99 GPUs of throughput."""
    r = _run([TraceJob("a", 0.0, 1, 3630.0, "resnet50")], 1, "volcano")["volcano"]
    s = summarise(r)
    assert s["busy_gpus"] == pytest.approx(100.0)
    assert s["throughput"] == pytest.approx(1.0)
    assert s["throughput"] == pytest.approx(s["throughput_makespan"])
    # Two jobs on two GPUs: 3630 + 1000 GPU-seconds of work over 3630 s.
    both = [TraceJob("a", 0.0, 1, 3630.0, "resnet50"), TraceJob("b", 0.0, 1, 1000.0, "resnet50")]
    s = summarise(_run(both, 2, "volcano")["volcano"])
    assert s["throughput"] == pytest.approx(4630.0 / 3630.0)
    assert s["busy_gpus"] == pytest.approx(100.0 * 4630.0 / (2 * 3630.0))


def test_a_policy_that_finishes_no_job_reads_n_a_not_nan() -> None:
    """A job wider than the cluster (the CLI clips it; the API does not) is rejected by
    every policy: no JCT, queueing or attainment exists, and the tables say so."""
    from elastico_extender.sim.report import (
        ablation_table,
        load_table,
        main_table,
        scalability_table,
        summaries,
    )

    runs = _run([TraceJob("a", 0.0, 4, 600.0, "resnet50")], 2, "volcano", "elastico")
    summ = summaries(runs)
    assert summ["volcano"]["finished"] == 0.0 and summ["volcano"]["rejected"] == 1.0
    tables = [
        main_table(summ),
        ablation_table(summ),
        load_table([(1.0, summ)]),
        scalability_table([(2, summ)]),
    ]
    for table in tables:
        assert "nan" not in table.lower() and "inf" not in table.lower(), table
        assert "n/a" in table


def test_pause_share_counts_every_gpu_a_paused_gang_holds() -> None:
    """SRTF preempts a 2-GPU job for a shorter one and resumes it with a restart cost: for
    that long it holds both GPUs without progress.  Before the fix ``pause_share`` counted
    the pause once, not once per GPU, and read half the paused share of the cluster."""
    jobs = [TraceJob("a", 0.0, 2, 3000.0, "resnet50"), TraceJob("b", 100.0, 2, 500.0, "resnet50")]
    r = _run(jobs, 2, "srtf")["srtf"]
    s = summarise(r)
    assert s["preemptions"] == 1.0
    restart = r.counters["pause_s"]  # one resume: the seconds job a paused
    assert restart > 0
    # Job a resumes at 660 (b ran 120-620; the next epoch), pays the restart, then runs
    # its remaining 2880 s.
    assert r.finish[0] == pytest.approx(660.0 + restart + 2880.0)
    assert s["pause_share"] == pytest.approx(100.0 * 2 * restart / (2 * s["makespan_s"]))
    held = 2 * (120.0 + r.finish[0] - 660.0) + 2 * 500.0  # a's two runs and b's, 2 GPUs each
    assert s["pause_gpu_share"] == pytest.approx(2 * restart / held)


def test_makespan_throughput_counts_only_the_work_that_was_done() -> None:
    """A rejected job's work is never done.  Before the fix ``throughput_makespan`` counted
    it: 5.0 GPUs of throughput on a 2-GPU cluster that ran one 1-GPU job."""
    jobs = [TraceJob("a", 0.0, 4, 600.0, "resnet50"), TraceJob("b", 0.0, 1, 600.0, "resnet50")]
    s = summarise(_run(jobs, 2, "volcano")["volcano"])
    assert (s["finished"], s["rejected"], s["makespan_s"]) == (1.0, 1.0, 600.0)
    assert s["throughput_makespan"] == pytest.approx(1.0)
    assert s["throughput"] == pytest.approx(1.0)
