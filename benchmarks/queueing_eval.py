"""Length-aware queueing on and off, several seeds of the benchmark world (issue 14, 1).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/queueing_eval.py --gpus 64 --load 1.5 --hours 12 --seeds 0,1,2

For each seed: Volcano, ElastiCo with ``length_aware=False`` (weight then FIFO,
no share-or-wait) and full ElastiCo, on the same synthetic trace.  The table
gives average, p99 JCT and the worst queueing delay (the fairness bound),
attainment, and ElastiCo's JCT relative to Volcano's.
"""

from __future__ import annotations

import argparse

from _args import positive_float, positive_int
from synthetic_rows import seeds

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import synthetic


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=positive_int, default=64)
    ap.add_argument("--load", type=positive_float, default=1.5)
    ap.add_argument("--hours", type=positive_float, default=12.0)
    ap.add_argument("--seeds", type=seeds, default="0,1,2")
    args = ap.parse_args()
    print(f"{args.gpus} GPUs, load {args.load}, {args.hours:g} h synthetic (benchmark world)\n")
    print("| seed | policy | avg JCT (s) | vs volcano | p99 JCT (s) | max queue (min) | attain. |")
    print("|---|---|---|---|---|---|---|")
    for seed in args.seeds:
        trace = synthetic(args.gpus, args.load, args.hours * 3600.0, seed)
        exp = Experiment(tuple(trace), ClusterSpec(gpus=args.gpus), seed, 60.0)
        base = None
        for name in ("volcano", "elastico-no-len", "elastico"):
            s = summarise(run_one(name, exp))
            base = base or s["avg_jct_s"]
            print(
                f"| {seed} | {name} | {s['avg_jct_s']:.0f} | {s['avg_jct_s'] / base:.2f}x | "
                f"{s['p99_jct_s']:.0f} | {s['max_queue_s'] / 60:.0f} | {s['attainment']:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
