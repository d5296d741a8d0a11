"""Observed throughput: rank a family's configurations by what they were seen to deliver.

Why
---
ESP chooses each job's configuration (RST) by its throughput T(c), and the
catalog's T(c) is a profile taken elsewhere: a few percent off per
configuration (the simulator draws that error with sigma 5%), which is as large
as the gaps between a family's best configurations.  So ESP ranks those by the
profile's error.  The closed loop already measures each family's solo rate at
each configuration it ran
(:meth:`~elastico_extender.core.observations.ObservationBook.family_solo_rates`:
windows in which a job of the family ran alone, about ten of them averaged);
"observed beats predicted", so the planner reads them in place of the profile.

Rules, per family, where the book's rates are in the family's own throughput
unit (a framework counter such as samples/s or tokens/s; launch rates are not:
kernels per step differ between configurations, so they rank nothing):

* a configuration measured alone: its estimate moves from the profile's value
  toward the measured solo rate as windows accrue, by n / (n + ``PRIOR_WINDOWS``)
  in log space after n windows (3: a window is noisy, a few percent, and a
  first estimate that undersells the profile's winner would send its family's
  jobs to the runner-up, where the winner is not measured again);
* one not measured: its profile T(c), unless the family's measured configurations
  together say the profile is off by more than a configuration's own error could
  explain (their geometric mean of measured / profile beyond ``SHIFT`` = 10%,
  twice the per-configuration error): then the whole family runs at another speed
  here (another GPU model or software stack than the profiler's), and the
  unmeasured ones are scaled by that mean.  Without the rescaling a cluster 20%
  slower than the profiler would make every untried configuration look 25% faster
  than the tried ones and send every running job to try them; with it always, one
  measured configuration 5% below its profile would drag its family's untried ones
  down with it, and a profile's winner (the fastest on paper is the one most
  likely overstated) would never give way to the runner-up;
* a family never measured: the profile.

Only ranking and costs change: memory and SM demand stay the profile's (the
observed SM share is ``planner.observed_sm``'s), and a job pinned to its
default configuration keeps the profile's default (what its user asked for).
No exploration of its own: configurations get measured when ESP chooses them (new
jobs start where the table ranks best); one measured slower than its profile loses
its rank, one measured faster gains.

Measured (``benchmarks/observed_throughput.py``): see
``benchmarks/results/issue14/README.md``, "Observed throughput".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np

from elastico_extender.core.model import MeasuredRates, ProfileFamily
from elastico_extender.core.observations import ObservationBook

__all__ = [
    "MAX_DEVIATION",
    "PRIOR_WINDOWS",
    "SHIFT",
    "SoloRates",
    "corrected",
    "observed_throughput",
    "solo_rates",
]

PRIOR_WINDOWS = 3.0
"""How many solo windows the profile's value weighs against: a configuration's estimate
moves from the profile toward its measured rate by n / (n + 3) after n windows (module
doc)."""
SHIFT = 0.10
"""A family's measured / profile ratio (geometric mean over its measured configurations)
beyond which the whole family is taken to run at another speed here (module doc)."""

SoloRates = Callable[[Mapping[str, ProfileFamily], str | None], Mapping[str, MeasuredRates]]
"""A driver's hook: (the snapshot's families, its GPU model) -> their measured solo rates
(``solo_rates``)."""


def solo_rates(
    book: ObservationBook, families: Mapping[str, ProfileFamily], product: str | None = None
) -> dict[str, MeasuredRates]:
    """Per family with a measured configuration: its solo rate per configuration in its
    throughput unit, NaN where none was measured (``Snapshot.solo_rates``).

    ``product``: the GPU model whose rates to read, where the driver keys the book's
    family references by model (the extender: ``family@product``, since the same
    kernels run at another rate on another GPU); None: plain family names (the
    simulator's one GPU model).  The planner ranks a family's configurations once for
    the whole cluster, so the extender passes the model most of its GPUs are.
    """
    out: dict[str, MeasuredRates] = {}
    for name, family in families.items():
        key = name if product is None else f"{name}@{product}"
        measured = book.family_solo_rates(key, family.throughput_unit, family.size)
        if measured:
            rates = np.full(family.size, np.nan)
            windows = np.zeros(family.size, dtype=np.int64)
            configs = list(measured)
            rates[configs] = [rate for rate, _ in measured.values()]
            windows[configs] = [n for _, n in measured.values()]
            out[name] = MeasuredRates(rates, windows)
    return out


MAX_DEVIATION = 100.0
"""Measured / profile ratios are taken within [1/100, 100]: GPU models and software stacks
differ by up to some tens of times, more is a counter in another unit, a stalled window
or a broken exporter, and an unbounded ratio overflows the scores (inf) or zeroes T(c)."""


def corrected(profile: np.ndarray, measured: MeasuredRates | None) -> np.ndarray:
    """One family's T(c) (``profile``, its real configurations only) with the solo rates
    measured at them, by the module doc's rules; a new array."""
    out = np.array(profile, dtype=np.float64)
    if measured is None:
        return out
    size = min(out.size, measured.rate.size)  # the measured arrays, fitted to the profile
    rate, windows = np.full(out.size, np.nan), np.zeros(out.size)
    rate[:size], windows[:size] = measured.rate[:size], measured.windows[:size]
    seen = np.isfinite(rate) & (rate > 0)
    if not seen.any():
        return out
    # log(measured / profile), within MAX_DEVIATION; 0 unseen
    bound = math.log(MAX_DEVIATION)
    deviation = np.clip(np.log(np.where(seen, rate, out)) - np.log(out), -bound, bound)
    shift = float(deviation[seen].mean())
    shift = shift if abs(shift) > math.log1p(SHIFT) else 0.0
    trust = windows / (windows + PRIOR_WINDOWS)
    return out * np.exp(shift + np.where(seen, trust * (deviation - shift), 0.0))


def observed_throughput(
    names: list[str],
    throughput: np.ndarray,
    real: np.ndarray,
    rates: Mapping[str, MeasuredRates],
) -> np.ndarray:
    """The (F, K) throughput table with each family's measured rates (``corrected``).

    ``throughput`` and ``real`` are the stacked profile table and its mask
    (``tables.stack_families``); rows of families without rates come back as they are.
    """
    out = throughput.copy()
    for f, name in enumerate(names):
        measured = rates.get(name)
        if measured is not None:
            size = int(real[f].sum())
            out[f, :size] = corrected(throughput[f, :size], measured)
    return out
