"""How much a duration estimator can know on each Philly week (issue 14, peers analysis).

Run:  python benchmarks/duration_signal.py

For every VC of ``peers_eval.PHILLY``, replays the week in arrival order through the
scheduler's own estimator (:class:`~elastico_extender.core.duration.DurationBook`,
started from the jobs that finished before the week, as the simulator starts it).
Each job is recorded once it would have finished had it run alone on arrival, and
each arriving job is asked its expected run time.  Printed: Spearman's rank
correlation of the guesses with the true durations, and the median factor between
them.  A scheduler that orders by these guesses can do no better than they rank.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers_eval import PHILLY

from elastico_extender.core.duration import CompletedJob, DurationBook
from elastico_extender.sim.traces import TraceJob, philly_trace


def replay(history: tuple[CompletedJob, ...], jobs: list[TraceJob]) -> np.ndarray:
    """Each job's expected run time when it arrives (0: the book had no guess yet)."""
    book: DurationBook[None] = DurationBook(history)
    finishing: list[tuple[float, int]] = []
    guesses = np.zeros(len(jobs))
    for k, job in enumerate(jobs):
        while finishing and finishing[0][0] <= job.arrival_s:
            done = jobs[heapq.heappop(finishing)[1]]
            book.record(CompletedJob(done.workload, done.gpus, done.duration_s, done.user))
        guesses[k] = book.expected(job.workload, job.gpus, job.user)
        heapq.heappush(finishing, (job.arrival_s + job.duration_s, k))
    return guesses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)  # no options: --help, and a typo is an error, not a run
    print("# command: python benchmarks/duration_signal.py")
    print("| VC | days | jobs | history | jobs with a guess | Spearman rho | median factor off |")
    print("|---|---|---|---|---|---|---|")
    for vc, days, _ in PHILLY:
        loaded = philly_trace(vc, seed=0, days=days)
        jobs = sorted(loaded.jobs, key=lambda j: j.arrival_s)
        guesses = replay(tuple(loaded.history), jobs)
        truth = np.array([j.duration_s for j in jobs])
        seen = guesses > 0
        rho = float(spearmanr(guesses[seen], truth[seen])[0]) if seen.sum() > 2 else math.nan
        off = float(np.exp(np.median(np.abs(np.log(guesses[seen] / truth[seen])))))
        print(
            f"| {vc} | {days[0]:g}-{days[1]:g} | {len(jobs)} | {len(loaded.history)} "
            f"| {int(seen.sum())} | {rho:.2f} | {off:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
