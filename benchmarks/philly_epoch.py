"""Per-epoch planning time of one policy on a Philly VC at its native load (issue 14, 6).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/philly_epoch.py --policy elastico+learned --gpus 48,128
    PYTHONPATH=. python benchmarks/philly_epoch.py --days 21:28 --gpus 48   # one week

Arrivals are rebased so the chosen days start at 0 (native load, no
compression).  One simulation per cluster size, one after the other; the table
gives plans, mean / p95 / max plan milliseconds, and average JCT (a sanity
check that the plans still do the work).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
from _args import comma_list, day_window, policy_name, positive_float, positive_int

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import TraceJob, fit_to_cluster, load_philly, offered_load


def window(
    vc: str, days: tuple[float, float] | None, seed: int, max_hours: float
) -> list[TraceJob]:
    """The VC's jobs arriving within ``days`` (whole trace if None), rebased to 0; none
    if no job arrives then."""
    jobs = load_philly(vc, seed=seed, max_duration_s=max_hours * 3600.0)
    if days:
        a, b = (x * 86400.0 for x in days)
        jobs = [j for j in jobs if a <= j.arrival_s < b]
    start = min((j.arrival_s for j in jobs), default=0.0)
    return [replace(j, arrival_s=j.arrival_s - start) for j in jobs]


def days_or_all(text: str) -> tuple[float, float] | None:
    """``--days``: 'START:END' days, or None for 'all'."""
    return None if text == "all" else day_window(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vc", default="ed69ec")
    ap.add_argument(
        "--days", type=days_or_all, default="21:28", help="'a:b' days of the trace; 'all' for all"
    )
    ap.add_argument("--gpus", type=comma_list(positive_int), default="48,128")
    ap.add_argument("--policy", type=policy_name, action="append")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-job-hours", type=positive_float, default=48.0, help="clip durations (h)")
    args = ap.parse_args()
    days = "all" if args.days is None else "{:g}:{:g}".format(*args.days)
    try:
        trace = window(args.vc, args.days, args.seed, args.max_job_hours)
    except ValueError as exc:  # no such VC
        ap.error(f"--vc {args.vc}: {exc}")
    if not trace:
        ap.error(f"--days {days}: no job of Philly VC {args.vc} arrives then")
    policies = args.policy or ["elastico+learned"]
    print(f"Philly {args.vc}, days {days}: {len(trace)} jobs, arrivals rebased to 0\n")
    print(
        "| GPUs | load | policy | plans | mean ms | p95 ms | max ms | avg JCT (s) | p99 JCT (s) "
        "| max queue (s) | avg stretch | max stretch |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for gpus in args.gpus:
        jobs = fit_to_cluster(trace, gpus)
        load = offered_load(jobs, gpus)
        exp = Experiment(tuple(jobs), ClusterSpec(gpus=gpus), args.seed, 60.0)
        for name in policies:
            r = run_one(name, exp)
            ms = np.asarray(r.plan_ms)
            s = summarise(r)
            print(
                f"| {gpus} | {load:.2f} | {name} | {ms.size} | {ms.mean():.1f} | "
                f"{np.percentile(ms, 95):.1f} | {ms.max():.1f} | {s['avg_jct_s']:.0f} | "
                f"{s['p99_jct_s']:.0f} | {s['max_queue_s']:.0f} | {s['avg_stretch']:.2f} | "
                f"{s['max_stretch']:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
