"""The gang's admission band (planner.gang_band) off and on: ``elastico+online`` side by side.

While the closed loop is engaged, a job of more than one GPU is co-located only
where its predicted slowdown clears tau by ``ADMIT_BAND + WIDE_JOB_BAND`` instead
of ``ADMIT_BAND`` (``core/planner/band.py``): a separated gang goes back to the
queue and waits for all its GPUs at once, and most separations at load 1.5 were
false alarms.  This runs the synthetic rows with ``planner.gang_band`` off (every
job the one-GPU band, the default) and on, same trace and seed, and prints
average JCT against Volcano, attainment, the jobs separated for observed harm (in
brackets those the truth had within tau), the harmful pairs (true slowdown above
tau while together) and how many of them stayed together over two epochs,
job-hours above tolerance and the harm p95.

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/gang_band.py --load 1.5 --hours 12 --seeds 0-15
    PYTHONPATH=. python benchmarks/gang_band.py --load 1.0 --seeds 0-7
"""

from __future__ import annotations

import numpy as np
from synthetic_rows import ATTAINMENT_COLUMN, HARM_COLUMNS, on_off, row_parser

from elastico_extender.sim.engine import RunResult
from elastico_extender.sim.runner import Experiment


def separated(result: RunResult) -> str:
    """Jobs separated for observed harm (truly within tau)."""
    truth = result.separated_truth
    return f"{len(truth)} ({sum(x <= 1.0 for x in truth)})"


def harmful(result: RunResult, exp: Experiment) -> str:
    """Pairs truly above tau while together / of them together over two epochs."""
    epochs = np.array(result.harm_s) / exp.epoch_s
    return f"{epochs.size} / {int((epochs > 2.0).sum())}"


COLUMNS = (
    ATTAINMENT_COLUMN,
    ("separated (truly within tau)", lambda s, r, e: separated(r)),
    ("harmful pairs / over 2 epochs", lambda s, r, e: harmful(r, e)),
    *HARM_COLUMNS,
)


def main(argv: list[str] | None = None) -> int:
    args = row_parser(__doc__.split("\n")[0]).parse_args(argv)
    on_off(args, "gang_band", COLUMNS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
