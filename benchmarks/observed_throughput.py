"""Observed throughput (RST learning) on and off: ``elastico+online`` side by side.

The closed loop measures each family's solo rate per configuration; with
``observed_throughput`` the planner ranks configurations by those rates instead of
the profile's T(c) (``core/planner/observed_throughput.py``).  This runs the
synthetic rows with it off (profiles always, the tree before) and on, same trace
and seed, and prints average JCT against Volcano, attainment, reconfigurations,
the configuration efficiency (throughput at the chosen configurations over the
default's, both true), job-hours above tolerance and the harm p95 (epochs a pair
truly above tolerance stays together).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/observed_throughput.py --load 1.5 --hours 24 --seeds 0-3
    PYTHONPATH=. python benchmarks/observed_throughput.py --world production --seeds 0
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import synthetic

POLICY = "elastico+online"


def seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    if hi:
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--load", type=float, default=1.5)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seeds", type=seeds, default=[0])
    ap.add_argument("--world", choices=("benchmark", "production"), default="benchmark")
    args = ap.parse_args(argv)
    print(f"## {args.gpus} GPUs, load {args.load}, {args.hours:g} h, {args.world} world\n")
    print(
        "| seed | observed throughput | avg JCT vs volcano | attainment % | reconfigurations "
        "| config efficiency | job-h above tau | harm p95 epochs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    means: dict[bool, list[float]] = {False: [], True: []}
    for seed in args.seeds:
        jobs = synthetic(args.gpus, args.load, args.hours * 3600.0, seed)
        exp = Experiment(
            trace=tuple(jobs), cluster=ClusterSpec(gpus=args.gpus), seed=seed, world=args.world
        )
        fifo = summarise(run_one("volcano", exp))["avg_jct_s"]
        for on in (False, True):
            planner = PlannerSettings(observed_throughput=on)
            result = run_one(POLICY, replace(exp, planner=planner))
            s = summarise(result)
            means[on].append(s["avg_jct_s"] / fifo)
            harm = np.array(result.harm_s) / exp.epoch_s
            p95 = float(np.percentile(harm, 95)) if harm.size else 0.0
            above = result.counters.get("above_tolerance_s", 0.0) / 3600.0
            print(
                f"| {seed} | {'on' if on else 'off'} | {s['avg_jct_s'] / fifo:.3f}x "
                f"| {s['attainment']:.1f} | {s['reconfigurations']:.0f} "
                f"| {s['config_efficiency']:.3f} | {above:.1f} | {p95:.1f} |",
                flush=True,
            )
    if len(args.seeds) > 1:
        for on, ratios in means.items():
            mean = sum(ratios) / len(ratios)
            print(f"| mean | {'on' if on else 'off'} | {mean:.3f}x | | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
