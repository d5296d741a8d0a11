"""Per-epoch latency of the core planner (issue 2; spec table "Per-epoch scheduling latency").

Run:  python benchmarks/epoch_latency.py            (full table, a few minutes)
      python benchmarks/epoch_latency.py --quick    (small sizes only)

Scenario per row: a cluster where N jobs were placed by a first, cold epoch
(all of them when they fit; the last rows are overloaded, so a queue remains)
and 2% of N new jobs arrive; we time the warm epoch (M <= 3 rounds,
warm-started prices), the steady-state cost a running scheduler pays every
Delta T.  Every job has exactly K configurations: K = 198 uses the catalog's
DeepSeek/Qwen inference families, other K use a training family whose batch
sizes are chosen to give K configurations.  The breakdown columns are the
planner's own phase timers (ms): validate (snapshot checks, job columns),
build (snapshot -> padded arrays), scoring (ESP cost matrix), tatonnement,
binpacking, interference (batched IAC check), coordination (repair), output
(the Plan's records); 'total' is wall time of plan() on a freshly built
Snapshot (same job records, so the snapshot's per-epoch caches are timed too).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _args import positive_int

from elastico_extender.core.model import GpuDevice, Job, Node, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.shapes.catalog import (
    CATALOG,
    TrainingSpec,
    build_family,
    family_from_spec,
)

PHASES = (
    "validate",
    "build",
    "scoring",
    "tatonnement",
    "binpacking",
    "interference",
    "coordination",
    "output",
)


def families_with_k(k: int) -> dict:
    """Families that all have exactly ``k`` configurations."""
    if k == 198:
        return {n: build_family(n) for n in ("deepseek-1.5b", "qwen-1.7b")}
    if k % 4:
        raise SystemExit("K must be a multiple of 4 (batch sizes x checkpointing x AMP) or 198")
    fams = {}
    for name in ("resnet50", "transformer", "dcgan", "pointnet"):
        spec = CATALOG[name]
        assert isinstance(spec, TrainingSpec)
        sizes = tuple(32 * (i + 1) for i in range(k // 4))
        fams[name] = family_from_spec(TrainingSpec(**{**spec.__dict__, "batch_sizes": sizes}))
    return fams


def scenario(n_jobs: int, k: int, gpus: int, seed: int = 0) -> tuple[Snapshot, object]:
    fams = families_with_k(k)
    names = sorted(fams)
    rng = np.random.default_rng(seed)
    nodes = tuple(
        Node(f"n{i}", tuple(GpuDevice(g, 40960.0, "A100-SXM4-40GB") for g in range(8)))
        for i in range(max(gpus // 8, 1))
    )
    kinds = {n: fams[n].kind for n in names}
    jobs = tuple(
        Job(f"j{i}", names[rng.integers(len(names))], arrival_time=float(i)) for i in range(n_jobs)
    )
    jobs = tuple(Job(j.id, j.family, kinds[j.family], arrival_time=j.arrival_time) for j in jobs)
    cold = plan(Snapshot(nodes, jobs, fams))
    running = []
    for job in jobs:
        a = cold.assignments.get(job.id)
        if a is None:
            running.append(job)
        else:
            running.append(
                Job(
                    job.id,
                    job.family,
                    job.kind,
                    current_config=a.config_index,
                    devices=a.devices,
                    arrival_time=job.arrival_time,
                )
            )
    arrivals = max(1, n_jobs // 50)
    for i in range(arrivals):
        name = names[rng.integers(len(names))]
        running.append(Job(f"new{i}", name, kinds[name], arrival_time=float(n_jobs + i)))
    return Snapshot(nodes, tuple(running), fams, epoch=1), cold


def measure(n_jobs: int, k: int, gpus: int, repeats: int) -> dict[str, float]:
    snapshot, previous = scenario(n_jobs, k, gpus)
    totals: list[float] = []
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    rounds = iterations = queued = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        # A fresh snapshot each time, as a driver builds one per epoch: its per-snapshot
        # caches (job columns, worker devices) are part of the timed epoch.  The nodes
        # tuple is reused, as drivers do while the cluster is unchanged.
        fresh = Snapshot(snapshot.nodes, snapshot.jobs, snapshot.families, snapshot.epoch)
        result = plan(fresh, previous, timer=time.perf_counter)  # type: ignore[arg-type]
        totals.append((time.perf_counter() - t0) * 1000)
        for p in PHASES:
            phases[p].append(result.stats.get(p, 0.0))
        rounds, iterations = result.stats["rounds"], result.stats["price_iterations"]
        queued = float(len(result.queued))
    row = {p: statistics.median(v) for p, v in phases.items()}
    row["queued"] = queued
    row["total"] = statistics.median(totals)
    row["p95"] = float(np.percentile(totals, 95))
    row["rounds"] = rounds
    row["iterations"] = iterations
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes only")
    parser.add_argument("--repeats", type=positive_int, default=7)
    args = parser.parse_args(argv)
    print(f"# command: python benchmarks/epoch_latency.py {' '.join(argv or sys.argv[1:])}")
    cases = [(30, 198, 64), (200, 198, 512), (500, 198, 512), (500, 8, 512)]
    if not args.quick:
        cases += [
            (1000, 64, 2048),
            (2000, 64, 4096),
            (5000, 64, 10000),
            (10000, 64, 20000),
            (500, 16, 512),
            (500, 64, 512),
            # Overloaded: more work than GPUs, so squeeze and residual admission run too.
            (300, 64, 128),
            (600, 8, 256),
            (2000, 64, 512),
        ]
    header = ("N", "K", "GPUs", "queued", *PHASES, "total", "p95", "rounds", "iters")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for n_jobs, k, gpus in cases:
        repeats = args.repeats if n_jobs <= 2000 else max(3, args.repeats // 2)
        row = measure(n_jobs, k, gpus, repeats)
        cells = [
            n_jobs,
            k,
            gpus,
            int(row["queued"]),
            *(f"{row[p]:.2f}" for p in PHASES),
            f"{row['total']:.2f}",
            f"{row['p95']:.2f}",
            int(row["rounds"]),
            int(row["iterations"]),
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
