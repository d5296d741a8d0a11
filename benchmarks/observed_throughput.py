"""Observed throughput (RST learning) on and off: ``elastico+online`` side by side.

The closed loop measures each family's solo rate per configuration; with
``observed_throughput`` the planner ranks configurations by those rates instead of
the profile's T(c) (``core/planner/observed_throughput.py``).  This runs the
synthetic rows with it off (profiles always, the tree before) and on, same trace
and seed, and prints average JCT against Volcano, attainment, reconfigurations,
the configuration efficiency (throughput at the chosen configurations over the
default's, both true), job-hours above tolerance and the harm p95 (epochs a pair
truly above tolerance stays together).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/observed_throughput.py --load 1.5 --hours 24 --seeds 0-3
    PYTHONPATH=. python benchmarks/observed_throughput.py --world production --seeds 0
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
    print(f"## {args.gpus} GPUs, load {args.load}, {args.hours:g} h, {args.world} world\n")
    print(
        "| seed | observed throughput | avg JCT vs volcano | attainment % | reconfigurations "
        "| config efficiency | job-h above tau | harm p95 epochs |"
    )
    print("|---|---|---|---|---|---|---|---|")
    means: dict[bool, list[float]] = {False: [], True: []}
    for seed in args.seeds:
        exp = experiment(args, seed)
        fifo = summarise(run_one("volcano", exp))["avg_jct_s"]
        for on in (False, True):
            planner = PlannerSettings(observed_throughput=on)
            result = run_one(POLICY, replace(exp, planner=planner))
            s = summarise(result)
            means[on].append(s["avg_jct_s"] / fifo)
            above, p95 = harm(result, exp)
            print(
                f"| {seed} | {'on' if on else 'off'} | {s['avg_jct_s'] / fifo:.3f}x "
                f"| {s['attainment']:.1f} | {s['reconfigurations']:.0f} "
                f"| {s['config_efficiency']:.3f} | {above:.1f} | {p95:.1f} |",
                flush=True,
            )
    if len(args.seeds) > 1:
        for on, ratios in means.items():
            mean = sum(ratios) / len(ratios)
            print(f"| mean | {'on' if on else 'off'} | {mean:.3f}x | | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
