"""What the loop cannot learn: pairs its base predictor refuses (issue 11, Learn).

The correction learns from co-located pairs only, and the planner co-locates a pair
only when the corrected prediction admits it (both jobs within tau).  A harmless pair
the base predicts above tau is never co-located, so never observed, so never
corrected, unless observed pairs near it (neighbours) or of its family pair move it.
Issue 11 starts from a model that refuses 56% of another lab's harmless pairs; this
benchmark asks how many of them the loop gets back (on that lab's tables, Lucid's,
``--pairs colocate_info.csv --pairs single_data.csv``: ``results/loop/lucid_transfer.md``).

Protocol, per seed, on a pair CSV playing the user's cluster (``online_transfer.py``'s
options, the 2019 campaign by default): in rounds, every unit (a job pair on one GPU
type) not yet observed whose corrected prediction is within ``tau * margin`` in both
directions is co-located and observed (``--windows`` noisy windows, learned as the loop
learns them); the rounds go on until no new unit is admitted.  This is the most the
loop can learn: a cluster co-locates only some of the admissible pairs.  ``margin`` 1
is the loop as built; a margin above 1 tries pairs predicted a little above tau, each
such trial of a truly harmful pair costing the loop's harm bound (at most two epochs of
two jobs slowed beyond tau).  A pair is *harmless* when both measured slowdowns are
within tau.  Per margin the table gives the harmless pairs the base admits, those the
corrected predictor admits at the end, the harmful pairs co-located on the way (the
harm the learning cost) and the harmful pairs still admitted at the end.

Run:  python benchmarks/refused_pairs.py [--pairs CSV ...] [--gpu v100] [--seeds 0-2]
      [--margins 1,1.1,1.25] [--tau 1.5]   (about a minute on 2 cores)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from _args import comma_list, positive_float
from online_transfer import cluster, cluster_arguments, describe, observe, units

from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.interference.dataset import PairDataset

MAX_ROUNDS = 100
"""Rounds before giving up on a fixpoint (each round admits at least one new unit)."""


@dataclass(frozen=True)
class Outcome:
    """Unit counts at the end of one seed's rounds."""

    harmless: int  # both measured slowdowns within tau
    base_admits: int  # harmless ones the base predictor admits
    admitted: int  # harmless ones the corrected predictor admits at the end
    harmful_tried: int  # harmful ones co-located on the way
    harmful_admitted: int  # harmful ones the corrected predictor still admits at the end


def worst_per_unit(values: np.ndarray, unit: np.ndarray, size: int) -> np.ndarray:
    """The larger of each unit's two directions."""
    out = np.zeros(size)
    np.maximum.at(out, unit, values)
    return out


def rounds(
    data: PairDataset,
    predictor: SlowdownPredictor,
    tau: float,
    margin: float,
    args: argparse.Namespace,
    seed: int,
) -> Outcome:
    """Admit, observe and learn until no new unit is admitted (module doc)."""
    rng = np.random.default_rng([seed, 0x7A7])
    unit = units(data)
    size = int(unit.max()) + 1
    harmless = worst_per_unit(data.y, unit, size) <= tau
    base_worst = worst_per_unit(np.asarray(predictor.predict(data.x)), unit, size)
    base = base_worst <= tau
    correction = OnlineCorrection(predictor)
    observed = np.zeros(size, dtype=bool)
    predicted = base_worst
    for _ in range(MAX_ROUNDS):
        admit = ~observed & (predicted <= tau * margin)
        if not admit.any():
            break
        observe(correction, data, np.flatnonzero(admit[unit]), args.windows, args.noise, rng)
        observed |= admit
        predicted = worst_per_unit(np.asarray(correction.predict(data.x)), unit, size)
    final = predicted <= tau
    return Outcome(
        harmless=int(harmless.sum()),
        base_admits=int((base & harmless).sum()),
        admitted=int((final & harmless).sum()),
        harmful_tried=int((observed & ~harmless).sum()),
        harmful_admitted=int((final & ~harmless).sum()),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    cluster_arguments(ap)
    ap.add_argument(
        "--tau",
        type=positive_float,
        default=PlannerSettings().tau_default,
        help="tolerance of every job (default: the planner's tau_default)",
    )
    ap.add_argument(
        "--margins",
        type=comma_list(positive_float),
        default=[1.0, 1.1, 1.25],
        help="trial margins over tau (1: the loop as built)",
    )
    args = ap.parse_args(argv)
    if args.tau < 1:
        ap.error(f"--tau {args.tau:g}: must be >= 1 (a slowdown ratio)")
    if min(args.margins) < 1:
        ap.error(
            f"--margins: each must be >= 1 (1 is the loop as built), got {min(args.margins):g}"
        )
    data, predictors = cluster(ap, args)
    print(describe(data, args))
    for name, predictor in predictors.items():
        print(f"## {name}, tau {args.tau:g}: units (pairs on one GPU type), mean over seeds\n")
        print(
            "| margin | harmless | admitted by the base | admitted after learning "
            "| harmful co-located on the way | harmful still admitted |"
        )
        print("|---|---|---|---|---|---|")
        for margin in args.margins:
            runs = [rounds(data, predictor, args.tau, margin, args, s) for s in args.seeds]

            def mean(field: str, runs: list[Outcome] = runs) -> str:
                return f"{np.mean([getattr(r, field) for r in runs]):.0f}"

            print(
                f"| {margin:g} | {mean('harmless')} | {mean('base_admits')} | "
                f"**{mean('admitted')}** | {mean('harmful_tried')} | {mean('harmful_admitted')} |"
            )
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
