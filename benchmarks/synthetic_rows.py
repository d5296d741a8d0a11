"""What the side-by-side benchmarks of one planner setting share: the synthetic row's
arguments and experiment, and the closed loop's harm figures of a run."""

from __future__ import annotations

import argparse

import numpy as np
from _args import positive_float, positive_int

from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.runner import Experiment
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
