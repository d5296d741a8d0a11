"""Where the spec's 2.02x throughput goes: demand ceiling, interference, queue length.

Command (from the repository root; one simulation at a time)::

    PYTHONPATH=. python benchmarks/throughput_gap.py                 # 64 GPUs, 24 h, seed 0
    PYTHONPATH=. python benchmarks/throughput_gap.py --loads 1.0,2.0 --hours 24

For each load factor it runs, on one synthetic trace and seed, the compared
systems with the measured ground truth and again with every true excess
slowdown set to 0 (``Experiment.interference = 0``: co-location costs nothing,
a what-if ceiling; Volcano never co-locates, so it is run once).  It prints a
Markdown table with, per row:

* **Throughput**: useful GPU-equivalents over the arrival window (the metric of
  the main table) and its ratio to Volcano;
* **Demand ceiling**: the throughput if every job ran alone at its default
  configuration from the moment it arrived (no queue, no slowdown):
  ``sum_j gpus_j * min(duration_j, W - arrival_j) / W``.  No scheduler can beat
  it on this trace, so ``ceiling / Volcano`` is the largest throughput ratio the
  trace allows, whatever the packing;
* Volcano's average queueing delay and busy-GPU share, which say how far
  Volcano is from saturation.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from _args import comma_list, policy_name, positive_float, positive_int

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import TraceJob, offered_load, synthetic
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable

SYSTEMS = (
    "volcano",
    "lucid",
    "tiresias",
    "elastico",
    "elastico+online",
    "elastico+learned",
    "elastico+iac",
)


def demand_ceiling(trace: list[TraceJob], window_s: float) -> float:
    """GPU-equivalents per second if every job ran alone from its arrival (see module doc)."""
    arrival = np.array([j.arrival_s for j in trace])
    duration = np.array([j.duration_s for j in trace])
    gpus = np.array([j.gpus for j in trace], dtype=float)
    inside = np.clip(np.minimum(duration, window_s - arrival), 0.0, None)
    return float((gpus * inside).sum() / window_s)


def pair_yields(truth: GroundTruth, margin_mib: float, device_mib: float) -> str:
    """GPU-equivalents one shared GPU yields, best configuration pair per workload pair.

    For workloads a, b: the most ``rate_i / S(i|j) + rate_j / S(j|i)`` over their
    configurations i, j that fit one device together (memory, SM <= 1).
    """
    c = truth.configs
    s = truth.slowdown
    yields = c.rate[:, None] / s + c.rate[None, :] / s.T
    fits = (c.mem_mib[:, None] + c.mem_mib[None, :] <= device_mib - margin_mib) & (
        c.sm[:, None] + c.sm[None, :] <= 1.0 + 1e-9
    )
    best = []
    for a in range(len(c.names)):
        for b in range(a, len(c.names)):
            block = np.ix_(c.workload == a, c.workload == b)
            if fits[block].any():
                best.append(float(yields[block][fits[block]].max()))
    y = np.array(best)
    return (
        f"{y.size} workload pairs fit one GPU; best pair yields {y.mean():.2f} GPU-eq per "
        f"shared GPU on average (median {np.median(y):.2f}, max {y.max():.2f}; "
        f"{(y >= 1.5).mean():.0%} reach 1.5)"
    )


def loads(text: str) -> list[float]:
    """``--loads``: finite loads > 0, comma separated; '' for none (yields only)."""
    return comma_list(positive_float)(text) if text else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=positive_int, default=64)
    ap.add_argument("--hours", type=positive_float, default=24.0)
    ap.add_argument(
        "--loads", type=loads, default="1.0,2.0", help="'' runs no simulation (yields only)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--systems", type=comma_list(policy_name), default=",".join(SYSTEMS))
    args = ap.parse_args(argv)
    words = sys.argv[1:] if argv is None else list(argv)
    window = args.hours * 3600
    header = (
        "| Load | Interference | System | Throughput (GPU-eq) | vs Volcano | Avg queue (min) "
        "| Interf. eff. | Busy GPUs (%) |\n|---|---|---|---|---|---|---|---|"
    )
    lines = [
        f"Made by `PYTHONPATH=. python benchmarks/throughput_gap.py {' '.join(words)}`"
        f" ({args.gpus} GPUs, {args.hours:g} h arrival window, seed {args.seed}).\n",
    ]
    ceilings = []
    rows = []
    for load in args.loads:
        trace = synthetic(args.gpus, load, window, args.seed)
        ceiling = demand_ceiling(trace, window)
        base: float | None = None
        for truth_scale in (1.0, 0.0):
            exp = Experiment(
                tuple(trace), ClusterSpec(gpus=args.gpus), args.seed, interference=truth_scale
            )
            for name in args.systems:
                if name == "volcano" and truth_scale == 0.0:
                    continue  # never co-locates: the same run as with interference
                t0 = time.time()
                s = summarise(run_one(name, exp))
                print(
                    f"  load {load:g} x{truth_scale:g} {name}: {time.time() - t0:.0f}s",
                    file=sys.stderr,
                )
                if name == "volcano":
                    base = s["throughput"]
                    ceilings.append(
                        f"| {offered_load(trace, args.gpus, window):.2f} | {len(trace)} "
                        f"| {ceiling:.1f} | {s['throughput']:.1f} "
                        f"| {ceiling / s['throughput']:.2f}x "
                        f"| {s['avg_queue_s'] / 60:.1f} | {s['busy_gpus']:.1f} |"
                    )
                ratio = f"{s['throughput'] / base:.2f}x" if base else "n/a"
                rows.append(
                    f"| {load:g} | {'measured' if truth_scale else 'none'} | {name} "
                    f"| {s['throughput']:.1f} | {ratio} | {s['avg_queue_s'] / 60:.1f} "
                    f"| {s['interference_efficiency']:.3f} | {s['busy_gpus']:.1f} |"
                )
    configs = ConfigTable.build(args.seed)
    truth = GroundTruth.build(configs)
    margin, device = PlannerSettings().memory_margin_mib, ClusterSpec().device_mib
    text = "\n".join(
        [
            *lines,
            f"Per shared GPU, measured interference: {pair_yields(truth, margin, device)}.  "
            f"Without interference: {pair_yields(truth.scaled(0.0), margin, device)}.\n",
            "| Offered load | Jobs | Demand ceiling (GPU-eq) | Volcano throughput "
            "| Ceiling / Volcano | Volcano avg queue (min) | Volcano busy GPUs (%) |",
            "|---|---|---|---|---|---|---|",
            *ceilings,
            "",
            header,
            *rows,
        ]
    )
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
