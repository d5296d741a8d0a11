"""Kept pair answers: the closed loop's planning time with and without them (issue 14).

Session 17 found most of ``elastico+online``'s simulated 64-GPU row in failed
placement searches of held-apart queued jobs, each screening the same pairs
epoch after epoch.  The placer now keeps S_hat per pair while the predictor's
generation stands still (``core.planner.pair_cache``).  This runs each row twice
in one process, pairs asked of the predictor every time (``CACHE_PAIRS = False``,
the tree before) and kept, and prints the time spent planning and in
``Placer.try_place`` (all calls, and the failed ones of rows with placement
constraints), and whether every job's start and finish are the same.

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/pair_cache_eval.py --rows b1.5,b1.0,p1.5
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.planner import placement
from elastico_extender.core.planner.placement import Placed, Placer
from elastico_extender.sim import runner
from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import synthetic

POLICY = "elastico+online"
WORLDS = {"b": "benchmark", "p": "production"}


@dataclass
class Clock:
    """Seconds and calls per kind of planning work."""

    plan_s: float = 0.0
    place_s: float = 0.0
    place_calls: int = 0
    held_refused_s: float = 0.0
    held_refused_calls: int = 0
    wall_s: float = 0.0


@contextmanager
def timed(clock: Clock) -> Iterator[None]:
    """Inside it, every ElastiCo plan and ``Placer.try_place`` call adds to ``clock``."""
    try_place = Placer.try_place
    build = runner.build_policy

    def place(self: Placer, row: int, *args: object, **kwargs: object) -> Placed | None:
        held = row in self.forbidden_rows
        t0 = time.perf_counter()
        placed = try_place(self, row, *args, **kwargs)  # type: ignore[arg-type]
        dt = time.perf_counter() - t0
        clock.place_s += dt
        clock.place_calls += 1
        if held and placed is None:
            clock.held_refused_s += dt
            clock.held_refused_calls += 1
        return placed

    def built(name: str, exp: Experiment, truth: object) -> object:
        policy = build(name, exp, truth)  # type: ignore[arg-type]
        plan: Callable[..., object] = policy.plan

        def timed_plan(*args: object, **kwargs: object) -> object:
            t0 = time.perf_counter()
            try:
                return plan(*args, **kwargs)
            finally:
                clock.plan_s += time.perf_counter() - t0

        policy.plan = timed_plan  # type: ignore[method-assign]
        return policy

    Placer.try_place = place  # type: ignore[method-assign,assignment]
    runner.build_policy = built  # type: ignore[assignment]
    try:
        yield
    finally:
        Placer.try_place = try_place  # type: ignore[method-assign]
        runner.build_policy = build


def run(exp: Experiment, keep: bool) -> tuple[RunResult, Clock]:
    """One ``elastico+online`` run, pair answers kept or not."""
    clock = Clock()
    was = placement.CACHE_PAIRS
    placement.CACHE_PAIRS = keep
    try:
        with timed(clock):
            t0 = time.perf_counter()
            result = run_one(POLICY, exp)
            clock.wall_s = time.perf_counter() - t0
    finally:
        placement.CACHE_PAIRS = was
    return result, clock


def same_jobs(a: RunResult, b: RunResult) -> bool:
    """Every job started and finished at the same instant (NaN: never), to the bit."""
    return all(
        np.array_equal(x, y, equal_nan=True)
        for x, y in ((a.first_start, b.first_start), (a.finish, b.finish), (a.status, b.status))
    )


def row(name: str, gpus: int, hours: float, seed: int) -> tuple[str, Experiment]:
    """``b1.5`` -> the benchmark world at load 1.5; ``p1.5`` the production world."""
    world, load = WORLDS[name[0]], float(name[1:])
    jobs = synthetic(gpus, load, hours * 3600.0, seed)
    exp = Experiment(trace=tuple(jobs), cluster=ClusterSpec(gpus=gpus), seed=seed, world=world)
    return f"{world}, load {load:g}", exp


def cells(clock: Clock) -> list[str]:
    return [
        f"{clock.wall_s:.1f}",
        f"{clock.plan_s:.1f}",
        f"{clock.place_s:.1f} ({clock.place_calls})",
        f"{clock.held_refused_s:.1f} ({clock.held_refused_calls})",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="b1.5", help="comma list: b<load> / p<load>")
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=24.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(f"## `{POLICY}`, {args.gpus} GPUs, {args.hours:g} h, seed {args.seed}\n")
    print("Seconds (calls); before: pairs asked every time, after: kept.\n")
    print(
        "| row | simulation s before / after | planning s before / after "
        "| try_place s before / after | held-apart refusals s before / after "
        "| planning speed-up | per-job JCT identical |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.rows.split(","):
        label, exp = row(name, args.gpus, args.hours, args.seed)
        before, slow = run(exp, keep=False)
        after, fast = run(exp, keep=True)
        pairs = zip(cells(slow), cells(fast), strict=True)
        joined = " | ".join(f"{a} / {b}" for a, b in pairs)
        speedup = slow.plan_s / fast.plan_s if fast.plan_s else float("nan")
        same = "yes" if same_jobs(before, after) else "**no**"
        print(f"| {label} | {joined} | {speedup:.2f}x | {same} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
