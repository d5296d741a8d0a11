"""Closed-loop interference (issue 11): policies with and without the loop, side by side.

Command (from the repository root; one scenario per run, same trace and seed
for every policy)::

    PYTHONPATH=. nice -n 5 python benchmarks/loop_eval.py --scenario load100
    PYTHONPATH=. nice -n 5 python benchmarks/loop_eval.py --scenario load150
    PYTHONPATH=. nice -n 5 python benchmarks/loop_eval.py --scenario philly
    PYTHONPATH=. python benchmarks/loop_eval.py --scenario load100 --hours 3 --gpus 16  # smoke

Scenarios: ``load100`` 64 GPUs, synthetic mix, load 1.0, 24 h; ``load150``
64 GPUs, load 1.5, 12 h; ``philly`` VC ed69ec (its own 64 GPUs) at load 1.0,
durations clipped at 48 h.  ``--policy`` replaces the default policy list.

Printed per policy: average JCT relative to Volcano, attainment, the harm
figures (p50/p95/max of how long a pair whose true slowdown exceeded the
victim's tolerance stayed co-located, in epochs, and the job-hours spent
above tolerance), separations made by the loop, and for online policies the
corrected predictor's MAPE against the truth on every configuration pair
observed so far (and the base predictor's on the same pairs) over time;
``--plot`` writes that curve as a PNG.  Results go to
``benchmarks/results/loop/<scenario>.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_experiment
from elastico_extender.sim.traces import (
    PHILLY_VC_GPUS,
    fit_to_cluster,
    load_philly,
    offered_load,
    scale_arrivals,
    synthetic,
)

OUT = Path(__file__).with_name("results") / "loop"
SCENARIOS = {
    "load100": ("synthetic", 1.0, 24.0),
    "load150": ("synthetic", 1.5, 12.0),
    "philly": ("philly:ed69ec", 1.0, None),
}
POLICIES = ("volcano", "elastico", "elastico+online", "elastico+iac")


def trace_for(scenario: str, gpus: int | None, hours: float | None, seed: int):
    kind, load, default_hours = SCENARIOS[scenario]
    hours = hours or default_hours
    if kind == "synthetic":
        gpus = gpus or 64
        assert hours is not None
        return synthetic(gpus, load, hours * 3600.0, seed), gpus
    vc = kind.split(":", 1)[1]
    gpus = gpus or PHILLY_VC_GPUS.get(vc, 64)
    jobs = load_philly(
        vc, seed=seed, max_duration_s=48 * 3600.0, window_s=hours * 3600.0 if hours else None
    )
    jobs = fit_to_cluster(jobs, gpus)
    span = max(j.arrival_s for j in jobs) or 1.0
    jobs = scale_arrivals(jobs, load / max(offered_load(jobs, gpus, span), 1e-9))
    return jobs, gpus


def harm_row(r: RunResult, epoch_s: float) -> list[str]:
    harm = np.array(r.harm_s) / epoch_s
    above_h = r.counters.get("above_tolerance_s", 0.0) / 3600.0
    if harm.size:
        p50, p95, worst = np.percentile(harm, 50), np.percentile(harm, 95), harm.max()
        spans = f"{harm.size} | {p50:.1f} | {p95:.1f} | {worst:.1f}"
    else:
        spans = "0 | - | - | -"
    return [spans, f"{above_h:.1f}"]


def table(results: dict[str, RunResult], epoch_s: float) -> str:
    summ = {n: summarise(r) for n, r in results.items()}
    base = summ.get("volcano")
    lines = [
        "| Policy | Avg JCT vs Volcano | Attainment (%) | Harmful pairs | Harm p50 (epochs) "
        "| Harm p95 (epochs) | Harm max (epochs) | Job-h above tau | Migr./Reconf./Preempt. "
        "| Plan ms mean/p95 | Wall s |",
        "|" + "---|" * 11,
    ]
    for name, r in results.items():
        s = summ[name]
        ratio = s["avg_jct_s"] / base["avg_jct_s"] if base else float("nan")
        c = r.counters
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    f"{ratio:.3f}x",
                    f"{s['attainment']:.1f}",
                    *harm_row(r, epoch_s),
                    f"{c['migrations']:.0f}/{c['reconfigurations']:.0f}/{c['preemptions']:.0f}",
                    f"{s['plan_ms_mean']:.1f}/{s['plan_ms_p95']:.1f}",
                    f"{r.wall_s:.0f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def mape_table(results: dict[str, RunResult]) -> str:
    out = []
    for name, r in results.items():
        if not r.mape:
            continue
        out.append(f"\n{name}: MAPE on observed configuration pairs (corrected / base)\n")
        out.append("| Hour | Pairs | Corrected MAPE (%) | Base MAPE (%) |\n|---|---|---|---|")
        for hour, pairs, fixed, base in r.mape:
            out.append(f"| {hour:.0f} | {pairs} | {fixed:.1f} | {base:.1f} |")
    return "\n".join(out)


def plot(results: dict[str, RunResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, r in results.items():
        if r.mape:
            hours = [m[0] for m in r.mape]
            ax.plot(hours, [m[2] for m in r.mape], label=f"{name} (corrected)")
            ax.plot(hours, [m[3] for m in r.mape], "--", label=f"{name} (base)")
    ax.axhline(10.0, color="grey", lw=0.8)
    ax.set_xlabel("simulated hours")
    ax.set_ylabel("MAPE on observed pairs (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="load100")
    p.add_argument(
        "--policy", action="append", help="policies (default: {})".format(", ".join(POLICIES))
    )
    p.add_argument("--gpus", type=int)
    p.add_argument("--hours", type=float)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--epoch", type=float, default=60.0)
    p.add_argument("--jobs", type=int, default=1, help="policies simulated at once")
    p.add_argument("--plot", action="store_true", help="write the MAPE-over-time plot")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    jobs, gpus = trace_for(args.scenario, args.gpus, args.hours, args.seed)
    exp = Experiment(
        trace=tuple(jobs), cluster=ClusterSpec(gpus=gpus), seed=args.seed, epoch_s=args.epoch
    )
    policies = args.policy or list(POLICIES)
    t0 = time.time()
    results = run_experiment(exp, policies, workers=args.jobs)
    command = "PYTHONPATH=. python benchmarks/loop_eval.py " + " ".join(argv or sys.argv[1:])
    text = (
        f"# Closed loop: {args.scenario} ({gpus} GPUs, {len(jobs)} jobs, seed {args.seed}, "
        f"epoch {args.epoch:.0f} s)\n\nCommand: `{command}` ({time.time() - t0:.0f} s)\n\n"
        + table(results, args.epoch)
        + "\n"
        + mape_table(results)
        + "\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = (
        args.scenario if not (args.hours or args.gpus) else f"{args.scenario}_{gpus}g_{args.hours}h"
    )
    (args.out / f"{tag}.md").write_text(text)
    if args.plot:
        plot(results, args.out / f"{tag}_mape.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
