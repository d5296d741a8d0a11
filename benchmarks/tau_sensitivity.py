"""How the shipped system's average JCT depends on ``tau_default`` (the tolerance of a job
without a throughput floor, ``PlannerSettings.tau_default``), side by side on the rows the
issues read: the synthetic mix (64 GPUs) and Philly weeks at native load.

``elastico+online`` at each tau against Volcano of the same experiment, with
attainment and requeues (harm separations and preemptions).  Tau is also what the loop
calls harm, so job-hours above it are not comparable across tau and are not printed.

Commands (from the repository root)::

    PYTHONPATH=. python benchmarks/tau_sensitivity.py --taus 1.3,1.4,1.5,1.6,1.7 --seeds 0-3
    PYTHONPATH=. python benchmarks/tau_sensitivity.py --taus 1.5,1.6 --philly 6214e9:41:48:144
    PYTHONPATH=. python benchmarks/tau_sensitivity.py --taus 1.5,1.6 --world production --seeds 0

``--philly VC:START:END:GPUS`` (repeatable) runs a Philly row as ``peers_eval.py`` does
(its busiest week, seed 0) instead of the synthetic rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

from _args import comma_list, day_window, positive_int
from peers_eval import week_experiment
from synthetic_rows import experiment, row_parser

from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import philly_trace

POLICY = "elastico+online"


def tau_value(text: str) -> float:
    """A ``--taus`` value the planner accepts (``PlannerSettings``' own check)."""
    try:
        return PlannerSettings.from_mapping({"tau_default": text}, label="").tau_default
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


PhillySpec = tuple[str, tuple[float, float], int]


def philly_spec(text: str) -> PhillySpec:
    """``VC:START:END:GPUS`` -> (VC, days window, GPUs)."""
    vc, _, rest = text.partition(":")
    days, _, gpus = rest.rpartition(":")
    if not (vc and days):
        raise argparse.ArgumentTypeError(f"{text!r}: use VC:START:END:GPUS")
    return vc, day_window(days), positive_int(gpus)


def philly_row(spec: PhillySpec, world: str) -> tuple[str, Experiment]:
    """(label, experiment) of a Philly row, as ``peers_eval.philly`` builds it."""
    vc, days, size = spec
    loaded = philly_trace(vc, seed=0, days=days)
    label = f"Philly {vc} d{days[0]:g}-{days[1]:g}, {size} GPUs"
    return label, week_experiment(loaded, size, world, 0)


def main(argv: list[str] | None = None) -> int:
    ap = row_parser(__doc__.split("\n")[0])
    ap.add_argument(
        "--taus",
        type=comma_list(tau_value),
        default="1.4,1.5,1.6",
        help="comma-separated tau_default values",
    )
    ap.add_argument(
        "--philly", type=philly_spec, action="append", default=[], metavar="VC:START:END:GPUS"
    )
    args = ap.parse_args(argv)
    rows = []
    for spec in args.philly:
        try:
            rows.append(philly_row(spec, args.world))
        except ValueError as exc:  # no such VC, or no job in the window
            ap.error(f"--philly {spec[0]}: {exc}")
    if not args.philly:
        rows = [
            (
                f"synthetic {args.gpus} GPUs, load {args.load:g}, {args.hours:g} h, seed {s}",
                experiment(args, s),
            )
            for s in args.seeds
        ]
    print(f"## tau_default, {args.world} world\n")
    print("| row | tau_default | avg JCT vs volcano | attainment % | requeues | wall s |")
    print("|---|---|---|---|---|---|")
    for label, exp in rows:
        fifo = summarise(run_one("volcano", exp))["avg_jct_s"]
        for tau in args.taus:
            t0 = time.perf_counter()
            result = run_one(POLICY, replace(exp, planner=PlannerSettings(tau_default=tau)))
            s = summarise(result)
            print(
                f"| {label} | {tau:g} | {s['avg_jct_s'] / fifo:.3f}x | {s['attainment']:.1f} "
                f"| {result.counters.get('preemptions', 0):.0f} "
                f"| {time.perf_counter() - t0:.0f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
