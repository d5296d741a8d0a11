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

from synthetic_rows import ATTAINMENT_COLUMN, HARM_COLUMNS, on_off, row_parser

COLUMNS = (
    ATTAINMENT_COLUMN,
    ("reconfigurations", lambda s, r, e: f"{s['reconfigurations']:.0f}"),
    ("config efficiency", lambda s, r, e: f"{s['config_efficiency']:.3f}"),
    *HARM_COLUMNS,
)


def main(argv: list[str] | None = None) -> int:
    args = row_parser(__doc__.split("\n")[0]).parse_args(argv)
    on_off(args, "observed_throughput", COLUMNS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
