"""What ElastiCo's planner reaches on one row when told the truth (issue 14 diagnostics).

A missed figure has three suspects: the interference prediction, the duration
estimate, and the policy itself.  This runs one row with Volcano (FIFO) and
``elastico+online`` (what the extender runs), then the same planner told the exact
slowdowns (``elastico+truth+online``), each with the estimator's durations and with
every job's true duration (``Experiment.oracle_durations``, an ORACLE diagnostic),
and prints average JCT against Volcano and where each job's time beyond its solo
run goes.  What the truthful planner still misses is the policy's, not a
prediction's.

Commands (from the repository root)::

    PYTHONPATH=. python benchmarks/planner_ceiling.py --gpus 64 --load 1.5 --hours 24
    PYTHONPATH=. python benchmarks/planner_ceiling.py --philly 6214e9 --days 41:48 --gpus 144
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from _args import day_window, positive_float, positive_int
from peers_eval import week_experiment

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.report import time_table
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import philly_trace, synthetic

PLANNERS = ("elastico+online", "elastico+truth+online")


def experiment(args: argparse.Namespace) -> tuple[Experiment, str]:
    """The row's experiment and a one-line description of it."""
    if args.philly:
        lo, hi = args.days
        loaded = philly_trace(args.philly, seed=args.seed, days=(lo, hi))
        exp = week_experiment(loaded, args.gpus, args.world, args.seed)
        return exp, f"Philly {args.philly} days {lo:g}:{hi:g}, {args.gpus} GPUs"
    jobs = synthetic(args.gpus, args.load, args.hours * 3600.0, args.seed)
    exp = Experiment(
        trace=tuple(jobs), cluster=ClusterSpec(gpus=args.gpus), seed=args.seed, world=args.world
    )
    return exp, f"synthetic mix, {args.gpus} GPUs, load {args.load}, {args.hours:g} h"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=positive_int, default=64)
    ap.add_argument("--load", type=positive_float, default=1.5, help="synthetic rows only")
    ap.add_argument("--hours", type=positive_float, default=24.0, help="synthetic rows only")
    ap.add_argument("--philly", help="a Philly VC instead of the synthetic mix")
    ap.add_argument(
        "--days", type=day_window, default="41:48", help="the Philly window, START:END days"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world", choices=("benchmark", "production"), default="benchmark")
    args = ap.parse_args(argv)
    try:
        exp, row = experiment(args)
    except ValueError as exc:  # no such VC, no job in the window, or too many jobs
        ap.error(f"{'--philly/--days' if args.philly else '--gpus/--load/--hours'}: {exc}")
    runs = [("volcano", "volcano", exp)]
    for name in PLANNERS:
        runs.append((name, name, exp))
        runs.append((f"{name}, true durations (ORACLE)", name, replace(exp, oracle_durations=True)))
    summ: dict[str, dict[str, float]] = {}
    walls: dict[str, float] = {}
    for label, policy, run_exp in runs:
        t0 = time.perf_counter()
        summ[label] = summarise(run_one(policy, run_exp))
        walls[label] = time.perf_counter() - t0
        print(f"  {label}: {walls[label]:.0f}s", file=sys.stderr, flush=True)
    fifo = summ["volcano"]["avg_jct_s"]
    print(f"## {row}, {args.world} world, seed {args.seed}: {len(exp.trace)} jobs\n")
    print("| variant | avg JCT s | vs volcano | attainment % | wall s |")
    print("|---|---|---|---|---|")
    for label, s in summ.items():
        print(
            f"| {label} | {s['avg_jct_s']:.0f} | {s['avg_jct_s'] / fifo:.3f}x "
            f"| {s['attainment']:.1f} | {walls[label]:.0f} |"
        )
    print("\nWhere each job's time goes (minutes per finished job):\n")
    print(time_table(summ))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
