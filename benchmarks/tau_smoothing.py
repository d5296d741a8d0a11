"""Tau's load U(t), smoothed or not: ``elastico+online`` side by side (issues 11 and 14).

The closed loop separates a pair observed above tau, and tau rises with the
offered load U(t).  This runs the synthetic rows with U taken afresh each plan
(``utilization_smoothing_s = 0``, the tree before) and averaged over the
default time constant, same trace and seed, and prints average JCT against
Volcano, attainment, job-hours above tolerance and the harm p95 (epochs).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/tau_smoothing.py --load 1.5 --hours 24 --seeds 0,1
    PYTHONPATH=. python benchmarks/tau_smoothing.py --load 1.0 --hours 24 --seeds 0-3
"""

from __future__ import annotations

from dataclasses import replace

from synthetic_rows import experiment, harm, row_parser

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import run_one

POLICY = "elastico+online"


def main(argv: list[str] | None = None) -> int:
    ap = row_parser(__doc__.split("\n")[0])
    args = ap.parse_args(argv)
    default = PlannerSettings().utilization_smoothing_s
    print(f"## {args.gpus} GPUs, load {args.load}, {args.hours:g} h, {args.world} world\n")
    print(
        "| seed | U smoothing s | avg JCT vs volcano | attainment % | job-h above tau "
        "| harm p95 epochs |"
    )
    print("|---|---|---|---|---|---|")
    for seed in args.seeds:
        exp = experiment(args, seed)
        fifo = summarise(run_one("volcano", exp))["avg_jct_s"]
        for seconds in (0.0, default):
            planner = PlannerSettings(utilization_smoothing_s=seconds)
            result = run_one(POLICY, replace(exp, planner=planner))
            s = summarise(result)
            above, p95 = harm(result, exp)
            print(
                f"| {seed} | {seconds:g} | {s['avg_jct_s'] / fifo:.3f}x | {s['attainment']:.1f} "
                f"| {above:.1f} | {p95:.1f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
