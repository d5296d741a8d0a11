"""The ``elastico`` command: one entry point for every way of running ElastiCo.

    elastico serve      run the scheduler extender (embedded demo cluster by default)
    elastico plan       run one planning epoch on a demo workload and print the plan
    elastico simulate   trace-driven comparison with FIFO, Lucid, Tiresias and SRTF baselines
    elastico train-iac  retrain the interference DNN on your own pair measurements
    elastico run        the container entrypoint (same as elastico-run)
    elastico catalog    list the built-in workload families (RST catalog)
    elastico runtime-bundle DEST   elastico-run + shim for an init container's volume
    elastico agent                 node agent of the closed loop (observes pods, reports them)

Subcommands added by other parts of the package register in ``SUBCOMMANDS``.
Logging is configured here and only here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from elastico_extender import __version__
from elastico_extender.core.model import GpuDevice, Job, Node, Snapshot
from elastico_extender.core.resources import GPU_MEM, GPU_SM, MAX_CLUSTER_GPUS, RESOURCE_NAMES
from elastico_extender.core.shapes.catalog import CATALOG, REFERENCE_DEVICE_MIB, catalog_families
from elastico_extender.errors import ElasticoError

__all__ = ["main", "reader_left"]

# name -> ("module:function", help); the function takes argv and returns an exit code.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "elastico_extender.sim.cli:main",
        "trace-driven simulation: ElastiCo vs FIFO, Lucid, Tiresias and SRTF (oracle) baselines",
    ),
    "train-iac": (
        "elastico_extender.interference.train_cli:main",
        "train the interference DNN on a pair CSV and export it to ONNX (needs torch)",
    ),
    "run": (
        "elastico_extender.launcher.run:main",
        "elastico-run: launch a workload with its assigned configuration (container entrypoint)",
    ),
    "runtime-bundle": (
        "elastico_extender.launcher.bundle:main",
        "copy elastico-run and the profiler shim into a shared volume (init container)",
    ),
    "agent": (
        "elastico_extender.agent.cli:main",
        "node agent (DaemonSet): observe pods' progress and report it to the extender",
    ),
    "serve": (
        "elastico_extender.service.cli:serve_main",
        "run the scheduler extender (embedded demo cluster unless --kubeconfig or in-cluster)",
    ),
}


MAX_DEMO_GPUS = MAX_CLUSTER_GPUS
MAX_DEMO_JOBS = 100_000


def _plan_demo(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="elastico plan",
        description="Plan one epoch for a random mix of the catalog's workloads on an "
        "embedded A100-40GB cluster (no Kubernetes needed).",
    )
    parser.add_argument("--gpus", type=int, default=16, help="GPUs, 8 per node (default 16)")
    parser.add_argument("--jobs", type=int, default=24, help="jobs arriving at once (default 24)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 1 <= args.gpus <= MAX_DEMO_GPUS:
        parser.error(f"--gpus must be 1..{MAX_DEMO_GPUS}, got {args.gpus}")
    if not 0 <= args.jobs <= MAX_DEMO_JOBS:
        parser.error(f"--jobs must be 0..{MAX_DEMO_JOBS}, got {args.jobs}")
    if args.seed < 0:
        parser.error(f"--seed must be >= 0, got {args.seed}")
    from elastico_extender.core.planner import plan

    families = catalog_families()
    rng = np.random.default_rng(args.seed)
    names = sorted(families)
    per_node = 8
    nodes = tuple(
        Node(
            f"node-{n}",
            tuple(
                GpuDevice(g, REFERENCE_DEVICE_MIB, "A100-SXM4-40GB")
                for g in range(min(per_node, args.gpus - n * per_node))
            ),
        )
        for n in range((args.gpus + per_node - 1) // per_node)
    )
    jobs = tuple(
        Job(
            f"job-{i:03d}",
            (name := names[rng.integers(len(names))]),
            families[name].kind,
            arrival_time=float(i),
        )
        for i in range(args.jobs)
    )
    start = time.perf_counter()
    result = plan(Snapshot(nodes, jobs, families), timer=time.perf_counter)
    elapsed = (time.perf_counter() - start) * 1000
    print(
        f"ElastiCo {__version__}: one epoch, {args.jobs} jobs on {args.gpus} GPUs "
        f"({elapsed:.1f} ms)\n"
    )
    print(
        f"{'job':<9} {'workload':<14} {'GPU':<10} {'mem GiB':>7} {'slowdown':>8} "
        f"{'action':<8} configuration"
    )
    for job in jobs:
        a = result.assignments.get(job.id)
        if a is None:
            state = (
                "rejected: " + result.rejected[job.id] if job.id in result.rejected else "queued"
            )
            print(f"{job.id:<9} {job.family:<14} {state}")
            continue
        where = ",".join(f"{n}/{g}" for n, g in a.devices)
        print(
            f"{job.id:<9} {job.family:<14} {where:<10} {a.memory_budget_mib / 1024:>7.1f} "
            f"{a.predicted_slowdown:>8.2f} {a.action.value:<8} {a.configuration.label}"
        )
    prices = ", ".join(f"{n}={p:.3f}" for n, p in zip(RESOURCE_NAMES, result.prices, strict=True))
    print(f"\nshadow prices: {prices}")
    note = _zero_price_note(jobs, families, args.gpus, result.prices, len(result.queued))
    if note:
        print(note)
    print(
        f"admitted {len(result.assignments)}, queued {len(result.queued)}, "
        f"co-located GPUs {int(result.stats['colocated_devices'])}, "
        f"SM allocated {result.stats['sm_allocated']:.0%}, "
        f"memory allocated {result.stats['memory_allocated']:.0%}"
    )
    return 0


def _zero_price_note(
    jobs: Sequence[Job], families: Mapping[str, Any], gpus: int, prices: Any, queued: int
) -> str:
    """Why every price is 0 although jobs wait (docs/plan-prices.md).

    ESP returns the prices of the best-valued feasible selection it found.  When demand at
    λ=0 is several times the capacity, the first step (proportional to the excess) lands
    where no job prefers running; when it is near capacity, higher prices admit nothing
    more.  Either way rationing at λ=0 is the best seen, and the queue shows the shortage.
    """
    if queued == 0 or float(np.max(prices)) > 0:
        return ""
    demand = sum((families[j.family].resources[families[j.family].fastest_index] for j in jobs),
                 np.zeros(len(RESOURCE_NAMES)))  # fmt: skip
    sm = demand[GPU_SM] / gpus
    mem = demand[GPU_MEM] / (gpus * REFERENCE_DEVICE_MIB)
    return (
        f"prices are 0 although {queued} {'job waits' if queued == 1 else 'jobs wait'}: "
        "ESP keeps the prices of the best feasible "
        "selection it finds, and no higher price it tried admitted more work than rationing "
        f"at λ=0 (demand at λ=0: {sm:.1f}x the GPU SMs, {mem:.1f}x the GPU memory); admission "
        "is by rationing in priority order, so the queue, not the price, shows the shortage "
        "(docs/plan-prices.md)"
    )


def _catalog(argv: Sequence[str]) -> int:
    argparse.ArgumentParser(
        prog="elastico catalog", description="List the built-in workload families."
    ).parse_args(argv)
    families = catalog_families()
    print(f"{'workload':<14} {'kind':<10} {'configs':>7} {'memory GiB':>12} knobs")
    for name in CATALOG:
        fam = families[name]
        gib = fam.resources[:, 1] / 1024
        knobs = ", ".join(k for k, _ in fam.configs[0].knobs)
        print(
            f"{name:<14} {fam.kind.value:<10} {fam.size:>7} "
            f"{gib.min():>5.1f}-{gib.max():<5.1f} {knobs}"
        )
    return 0


BUILTIN: dict[str, tuple[Callable[[Sequence[str]], int], str]] = {
    "plan": (_plan_demo, "plan one epoch on a demo workload and print the plan"),
    "catalog": (_catalog, "list the built-in workload families"),
}


def _resolve(name: str) -> Callable[[Sequence[str]], int]:
    if name in BUILTIN:
        return BUILTIN[name][0]
    module, _, func = SUBCOMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(module), func)


def _main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        **{k: v[1] for k, v in BUILTIN.items()},
        **{k: v[1] for k, v in SUBCOMMANDS.items()},
    }
    width = max(map(len, commands))
    usage = "\n".join(f"  {name:<{width}}  {text}" for name, text in sorted(commands.items()))
    if not argv or argv[0] in {"-h", "--help"}:
        # asked for, help is the output; without a command it is a usage error (stderr)
        print(
            f"usage: elastico <command> [options]\n\ncommands:\n{usage}\n\n"
            "Run 'elastico <command> --help' for a command's options.",
            file=sys.stdout if argv else sys.stderr,
        )
        return 0 if argv else 2
    if argv[0] == "--version":
        print(__version__)
        return 0
    name, rest = argv[0], argv[1:]
    if name not in commands:
        print(f"elastico: unknown command {name!r}\n\ncommands:\n{usage}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        return _resolve(name)(rest)
    except ElasticoError as exc:
        print(f"elastico {name}: error: {exc}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return reader_left()


def reader_left() -> int:
    """After a BrokenPipeError on stdout (`elastico plan | head`: the reader left): the
    exit code, with stdout pointed at /dev/null so the exit's flush does not fail too;
    quiet, as other filters are."""
    with contextlib.suppress(OSError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what a shell reports for a filter killed by it


if __name__ == "__main__":
    raise SystemExit(main())
