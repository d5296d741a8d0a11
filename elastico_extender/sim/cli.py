"""``elastico simulate``-style entry point: run policies side by side on one trace.

Examples::

    python -m elastico_extender.sim.cli --quick
    python -m elastico_extender.sim.cli --gpus 64 --load 1.0 --duration 24 --out results/main
    python -m elastico_extender.sim.cli --trace philly:ed69ec --duration 168 --policy volcano \
        --policy lucid --policy elastico
    python -m elastico_extender.sim.cli --trace my_trace.csv --interference my_pairs.csv

Every policy sees the same trace, cluster and seed.  Tables are printed and
written to ``--out`` with per-job and timeline CSVs and PNG plots.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.instances import instances_needed
from elastico_extender.sim.progress import ProgressBar
from elastico_extender.sim.report import (
    ablation_table,
    main_table,
    plot_all,
    summaries,
    write_run_files,
)
from elastico_extender.sim.runner import DEFAULT_POLICIES, Experiment, build_policy, run_experiment
from elastico_extender.sim.traces import (
    PHILLY_VC_GPUS,
    TraceJob,
    fit_to_cluster,
    load_csv,
    load_philly,
    offered_load,
    scale_arrivals,
    synthetic,
)
from elastico_extender.sim.truth import DEFAULT_PAIRS, GroundTruth
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["build_parser", "load_trace", "main"]

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elastico-sim",
        description="Trace-driven simulation of ElastiCo against Volcano-like and Lucid-like "
        "baselines (spec section 5).",
    )
    p.add_argument(
        "--policy",
        action="append",
        help="policy to run (repeatable; default: all of " + ", ".join(DEFAULT_POLICIES) + "); "
        "suffix '+learned' plans ElastiCo with a predictor learned from 25%% of the "
        "workload pairs, '+iac' with a spec-accuracy (7.6%% MAPE) predictor",
    )
    p.add_argument(
        "--trace",
        default="synthetic",
        help="'synthetic', 'philly:VC' (e.g. philly:ed69ec) or a CSV path (format: sim.traces)",
    )
    p.add_argument("--gpus", type=int, help="cluster GPUs (default 64; a Philly VC's own size)")
    p.add_argument(
        "--load",
        type=float,
        help="load factor: synthetic arrival rate, or arrivals of a trace rescaled to it "
        "(default 1.0 for synthetic, as recorded for traces)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--duration", type=float, help="arrival window in hours (default 24; whole trace for files)"
    )
    p.add_argument(
        "--epoch", type=float, default=60.0, help="scheduling epoch in simulated seconds"
    )
    p.add_argument("--out", default="sim-results", help="output directory")
    p.add_argument("--quick", action="store_true", help="small cluster, short trace (smoke test)")
    p.add_argument("--jobs", type=int, default=2, help="policies simulated in parallel")
    p.add_argument(
        "--interference",
        default=str(DEFAULT_PAIRS),
        help="measured pair CSV (format: sim.truth); 'none' uses the contention model only",
    )
    p.add_argument("--gpu-type", default="v100", help="GPU type rows of the pair CSV to prefer")
    p.add_argument("--profile-noise", type=float, default=0.05, help="sigma of log T_true/T")
    p.add_argument("--max-job-hours", type=float, default=48.0, help="clip Philly durations")
    p.add_argument("--instances", action="store_true", help="also count GPU instances per mix")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


def load_trace(args: argparse.Namespace) -> tuple[list[TraceJob], int, float]:
    """(jobs, cluster GPUs, window seconds) for the parsed arguments."""
    hours = args.duration
    gpus = args.gpus
    if args.trace == "synthetic":
        gpus = gpus or 64
        window = (hours or 24.0) * 3600.0
        load = 1.0 if args.load is None else args.load
        return synthetic(gpus, load, window, args.seed), gpus, window
    if args.trace.startswith("philly:"):
        vc = args.trace.split(":", 1)[1]
        gpus = gpus or PHILLY_VC_GPUS.get(vc, 64)
        window = hours * 3600.0 if hours else None
        jobs = load_philly(
            vc, seed=args.seed, max_duration_s=args.max_job_hours * 3600.0, window_s=window
        )
    else:
        gpus = gpus or 64
        jobs = load_csv(args.trace, args.seed)
        if hours:
            jobs = [j for j in jobs if j.arrival_s <= hours * 3600.0]
    jobs = fit_to_cluster(jobs, gpus)
    span = max(j.arrival_s for j in jobs) or 1.0
    if args.load is not None:
        jobs = scale_arrivals(jobs, args.load / max(offered_load(jobs, gpus, span), 1e-9))
        span = max(j.arrival_s for j in jobs) or 1.0
    return jobs, gpus, span


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.quick:
        args.gpus = args.gpus or 16
        args.duration = args.duration or 3.0
    policies = args.policy or list(DEFAULT_POLICIES)
    try:
        jobs, gpus, window = load_trace(args)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print("error: the trace has no jobs", file=sys.stderr)
        return 2
    pairs = None if args.interference.lower() == "none" else args.interference
    exp = Experiment(
        trace=tuple(jobs),
        cluster=ClusterSpec(gpus=gpus),
        seed=args.seed,
        epoch_s=args.epoch,
        pairs=pairs,
        profile_noise=args.profile_noise,
    )
    load = offered_load(jobs, gpus, window)
    print(
        f"trace={args.trace} jobs={len(jobs)} gpus={gpus} window={window / 3600:.1f}h "
        f"offered load={load:.2f} epoch={args.epoch:g}s seed={args.seed} "
        f"policies={','.join(policies)}"
    )
    bar = ProgressBar(f"simulating {len(policies)} policies")
    bar.enabled = not args.no_progress
    try:
        results = run_experiment(exp, policies, workers=args.jobs, on_progress=bar.update)
    except ValueError as exc:
        bar.close()
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar.update({n: (1, 1) for n in policies}, force=True)
    bar.close()
    summ = summaries(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"## Main results ({gpus} GPUs, normalised to volcano)\n", main_table(summ)]
    if sum(n.startswith("elastico") for n in summ) > 1 and "elastico" in summ:
        sections += ["\n## Ablation (normalised to full elastico)\n", ablation_table(summ)]
    if args.instances:
        configs = ConfigTable.build(args.seed, args.profile_noise)
        truth = GroundTruth.build(configs, pairs)
        mix = [j for j in jobs if j.gpus <= 8][:64]
        rows = ["| Policy | GPUs needed for the mix |", "|---|---|"]
        for name in policies:
            need = instances_needed(build_policy(name, exp, truth), mix, configs)
            rows.append(f"| {name} | {need} |")
        sections += [f"\n## GPU instances for a mix of {len(mix)} jobs\n", "\n".join(rows)]
    text = "\n".join(sections)
    print(text)
    for name, r in results.items():
        if r.anomalies or r.capacity_violations:
            print(
                f"WARNING {name}: {len(r.anomalies)} anomalies, "
                f"{len(r.capacity_violations)} capacity violations; first: "
                f"{(r.anomalies or [str(v) for v in r.capacity_violations])[:3]}"
            )
    walls = ", ".join(f"{n} {r.wall_s:.1f}s" for n, r in results.items())
    print(f"simulation wall time: {walls}")
    (out / "tables.md").write_text(text + "\n")
    write_run_files(results, out)
    if not args.no_plots:
        plot_all(results, out, title=f"({gpus} GPUs)")
    print(f"results written to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
