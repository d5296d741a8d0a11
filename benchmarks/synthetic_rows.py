"""What the side-by-side benchmarks of one planner setting share: the synthetic row's
arguments and experiment, the closed loop's harm figures of a run, and the on/off table
of one ablation switch."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from _args import positive_float, positive_int

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import synthetic


def seeds(text: str) -> list[int]:
    """'0-3' or '0,2,5': seeds >= 0, a range from low to high (never an empty list)."""
    lo, _, hi = text.partition("-")
    try:
        found = list(range(int(lo), int(hi) + 1)) if hi else [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: want 'LOW-HIGH' or 'A,B,C'") from None
    if not found or min(found) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: want seeds >= 0, LOW <= HIGH")
    return found


def row_parser(description: str) -> argparse.ArgumentParser:
    """--gpus, --load, --hours, --seeds and --world of a synthetic row."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--gpus", type=positive_int, default=64)
    ap.add_argument("--load", type=positive_float, default=1.5)
    ap.add_argument("--hours", type=positive_float, default=24.0)
    ap.add_argument("--seeds", type=seeds, default=[0])
    ap.add_argument("--world", choices=("benchmark", "production"), default="benchmark")
    return ap


def experiment(args: argparse.Namespace, seed: int) -> Experiment:
    """The row's synthetic trace on its cluster, in its world."""
    jobs = synthetic(args.gpus, args.load, args.hours * 3600.0, seed)
    return Experiment(
        trace=tuple(jobs), cluster=ClusterSpec(gpus=args.gpus), seed=seed, world=args.world
    )


def harm(result: RunResult, exp: Experiment) -> tuple[float, float]:
    """(job-hours spent above tolerance, p95 epochs a truly harmful pair stayed together)."""
    epochs = np.array(result.harm_s) / exp.epoch_s
    p95 = float(np.percentile(epochs, 95)) if epochs.size else 0.0
    return result.counters.get("above_tolerance_s", 0.0) / 3600.0, p95


Column = tuple[str, Callable[[dict, RunResult, Experiment], str]]
"""A table column: its header, and its cell from (summary, run, experiment)."""

ATTAINMENT_COLUMN: Column = ("attainment %", lambda s, r, e: f"{s['attainment']:.1f}")

HARM_COLUMNS: tuple[Column, ...] = (
    ("job-h above tau", lambda s, r, e: f"{harm(r, e)[0]:.1f}"),
    ("harm p95 epochs", lambda s, r, e: f"{harm(r, e)[1]:.1f}"),
)


def on_off(
    args: argparse.Namespace,
    switch: str,
    columns: Sequence[Column],
    policy: str = "elastico+online",
) -> None:
    """Print, per seed, ``policy`` with the ``PlannerSettings`` switch ``switch`` off and
    on (same trace and seed): average JCT against Volcano's, then ``columns``; and the
    means over the seeds."""
    print(f"## {args.gpus} GPUs, load {args.load}, {args.hours:g} h, {args.world} world\n")
    headers = ["seed", switch.replace("_", " "), "avg JCT vs volcano", *(h for h, _ in columns)]
    print("| " + " | ".join(headers) + " |")
    print("|" + "---|" * len(headers))
    means: dict[bool, list[float]] = {False: [], True: []}
    for seed in args.seeds:
        exp = experiment(args, seed)
        fifo = summarise(run_one("volcano", exp))["avg_jct_s"]
        for on in (False, True):
            planner = PlannerSettings(**{switch: on})
            result = run_one(policy, replace(exp, planner=planner))
            s = summarise(result)
            means[on].append(s["avg_jct_s"] / fifo)
            cells = [cell(s, result, exp) for _, cell in columns]
            state = "on" if on else "off"
            print(f"| {seed} | {state} | {means[on][-1]:.3f}x | " + " | ".join(cells) + " |",
                  flush=True)  # fmt: skip
    if len(args.seeds) > 1:
        for on, ratios in means.items():
            blank = " |" * len(columns)
            print(f"| mean | {'on' if on else 'off'} | {sum(ratios) / len(ratios):.3f}x |{blank}")
