"""Planner epoch latency of two checkouts side by side (ratios from one run).

Run:  git worktree add --detach /tmp/baseline <rev>
      python benchmarks/epoch_compare.py --baseline /tmp/baseline

Each size runs ``--rounds`` times, alternating a fresh process in the baseline
checkout and in this one, with the same scenario and timing as
``epoch_latency.py`` (a fresh Snapshot per epoch); the minimum of the medians
is printed per side, so a noisy moment on a shared machine hurts both alike.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CASES = [(30, 198, 64), (200, 198, 512), (500, 198, 512), (500, 8, 512), (5000, 64, 10000),
         (10000, 64, 20000)]  # fmt: skip

TIMER = r"""
import os, statistics, sys, time
# This checkout's scenario code, run as if it lived in the checkout being timed (it puts
# its own checkout first on sys.path), so every class and plan() come from that checkout.
source = open(sys.argv[5]).read()
here = {"__name__": "epoch_scenario", "__file__": os.path.abspath("benchmarks/epoch_latency.py")}
exec(compile(source, sys.argv[5], "exec"), here)
scenario = here["scenario"]
import elastico_extender
assert elastico_extender.__file__.startswith(os.path.abspath(".")), elastico_extender.__file__
from elastico_extender.core.model import Snapshot
from elastico_extender.core.planner import plan
n, k, g, reps = map(int, sys.argv[1:5])
snap, prev = scenario(n, k, g)
times = []
for _ in range(reps):
    fresh = Snapshot(snap.nodes, snap.jobs, snap.families, snap.epoch)
    t0 = time.perf_counter(); plan(fresh, prev); times.append((time.perf_counter() - t0) * 1e3)
print(statistics.median(times))
"""


def median_ms(root: Path, n: int, k: int, g: int, reps: int) -> float:
    script = HERE / "benchmarks" / "epoch_latency.py"
    command = [sys.executable, "-c", TIMER, *map(str, (n, k, g, reps)), str(script)]
    out = subprocess.run(command, cwd=root, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="another checkout")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.rounds < 1:  # checked here: this process imports neither checkout's code
        parser.error("argument --rounds: must be >= 1")
    print(f"# command: python benchmarks/epoch_compare.py --baseline {args.baseline}")
    print("| N x K on GPUs | baseline (ms) | this checkout (ms) | speed-up |")
    print("|---|---|---|---|")
    for n, k, g in CASES:
        reps = 15 if n <= 500 else 5
        old, new = [], []
        for _ in range(args.rounds):
            old.append(median_ms(args.baseline, n, k, g, reps))
            new.append(median_ms(HERE, n, k, g, reps))
        before, after = min(old), min(new)
        row = f"| {n} x {k} on {g} | {before:.2f} | {after:.2f} | {before / after:.2f}x |"
        print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
