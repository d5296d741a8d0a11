"""Online correction of any slowdown predictor from observed co-location (closed loop, Learn).

No offline model knows a cluster's own jobs, so the planner's predictions are
corrected by what the cluster has observed (spec 3.3, 3.4 "closed-loop
control"; future work "online learning").  :class:`OnlineCorrection` wraps
any base :class:`SlowdownPredictor` (ONNX DNN, the contention heuristic, the
simulator's learned k-NN) and itself implements the protocol, so the planner
does not know it is there.

Model (log space, hierarchical shrinkage toward the base prediction)
--------------------------------------------------------------------
Every labelled sample is a feature row x (36 columns, :mod:`.features`) and an
observed slowdown S_obs.  Its residual is ``r = log S_obs - log base(x)``.
Residuals are pooled at two levels:

* the *configuration pair* (victim and partner job blocks, columns 0..27):
  mean residual r_c over n_c samples;
* the *family pair* (victim and partner ``is_inference`` and ``log10_params``,
  columns 5, 6, 19, 20, constant over a family's configurations): mean
  residual r_f over n_f samples.  This is the neighbourhood estimate for
  configuration pairs of a known family pair that were never observed.

The answer for a row is::

    log S = log base(x) + w_c * r_c + (1 - w_c) * w_f * r_f,   w = n / (n + n0)

so a seen configuration pair converges to its observed (mean log) slowdown as
evidence accumulates, a new configuration of a seen family pair is shifted by
its family pair's shrunk residual, and an unseen family pair gets the base
answer unchanged.  n0 (``prior_samples``) is how many observations the base
prediction is worth.  Counts are capped at ``memory`` samples, after which a
mean becomes an exponentially weighted one (a drifting workload is followed).

Rows are keyed by a 64-bit hash of their float32 bytes computed in numpy, and
looked up with ``searchsorted``: one vectorised call per batch, and the base
answer untouched (zero overhead) while nothing has been learned.  The state is
bounded (``max_pairs`` configuration pairs, least recently updated dropped)
and plain rows (:meth:`rows` / :meth:`restore_rows`), so a driver persists it.

Multi-tenant windows (three or more jobs on a device) and gang jobs with
several partners are not attributed: the driver passes only samples whose
victim had exactly one partner (see :func:`single_partner`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.core.interference.predictor import SlowdownPredictor, check_feature_batch
from elastico_extender.core.observations import PairSample

__all__ = ["FAMILY_COLUMNS", "OnlineCorrection", "pair_keys", "single_partner"]

CONFIG_COLUMNS = 28
"""Columns identifying a configuration pair: both 14-column job blocks."""
FAMILY_COLUMNS = (5, 6, 19, 20)
"""Columns identifying a family pair: each job's is_inference and log10_params."""

_MULT = np.random.default_rng(0x0C0FFEE).integers(1, 2**62, size=NUM_FEATURES, dtype=np.uint64) | 1


def pair_keys(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(configuration-pair key, family-pair key) per row, uint64 hashes of float32 bytes."""
    bits = np.ascontiguousarray(features, dtype=np.float32).view(np.uint32).astype(np.uint64)
    with np.errstate(over="ignore"):
        config = (bits[:, :CONFIG_COLUMNS] * _MULT[:CONFIG_COLUMNS]).sum(axis=1, dtype=np.uint64)
        cols = list(FAMILY_COLUMNS)
        family = (bits[:, cols] * _MULT[cols]).sum(axis=1, dtype=np.uint64)
    return config, family


def single_partner(samples: Iterable[PairSample], partners: dict[str, int]) -> list[PairSample]:
    """The samples whose victim window had exactly one partner (``partners``: id -> count)."""
    return [s for s in samples if partners.get(s.victim, 0) == 1]


class _Level:
    """Mean log-residual and capped count per key, with sorted arrays for lookup."""

    def __init__(self, memory: int, limit: int) -> None:
        self.memory = memory
        self.limit = limit
        self.table: OrderedDict[int, tuple[float, float]] = OrderedDict()
        self._keys = np.zeros(0, dtype=np.uint64)
        self._mean = np.zeros(0)
        self._count = np.zeros(0)
        self._dirty = False

    def add(self, keys: np.ndarray, residuals: np.ndarray) -> None:
        table = self.table
        for key, r in zip(keys.tolist(), residuals.tolist(), strict=True):
            mean, n = table.pop(key, (0.0, 0.0))
            n = min(n + 1.0, float(self.memory))
            table[key] = (mean + (r - mean) / n, n)
        while len(table) > self.limit:
            table.popitem(last=False)
        self._dirty = True

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean residual, count) per key; 0, 0 where unseen."""
        if self._dirty:
            order = sorted(self.table)
            self._keys = np.array(order, dtype=np.uint64)
            self._mean = np.array([self.table[k][0] for k in order])
            self._count = np.array([self.table[k][1] for k in order])
            self._dirty = False
        mean = np.zeros(keys.size)
        count = np.zeros(keys.size)
        if self._keys.size == 0 or keys.size == 0:
            return mean, count
        at = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        hit = self._keys[at] == keys
        mean[hit] = self._mean[at[hit]]
        count[hit] = self._count[at[hit]]
        return mean, count


class OnlineCorrection:
    """A :class:`SlowdownPredictor` that corrects ``base`` by observed slowdowns (module doc)."""

    def __init__(
        self,
        base: SlowdownPredictor,
        *,
        prior_samples: float = 1.0,
        memory: int = 50,
        max_pairs: int = 200_000,
    ) -> None:
        if prior_samples <= 0 or memory < 1 or max_pairs < 1:
            raise ValueError("prior_samples must be > 0, memory and max_pairs >= 1")
        self.base = base
        self.name = f"{getattr(base, 'name', type(base).__name__)}+online"
        self.prior_samples = float(prior_samples)
        self._config = _Level(memory, max_pairs)
        self._family = _Level(memory, max(1, max_pairs // 10))
        self.samples_seen = 0

    # -- the predictor protocol ------------------------------------------------
    def predict(self, features: np.ndarray) -> np.ndarray:
        x = check_feature_batch(features)
        base = np.asarray(self.base.predict(x), dtype=np.float64)
        if self.samples_seen == 0 or x.shape[0] == 0:
            return base
        return self._correct(x, base)

    def _correct(self, x: np.ndarray, base: np.ndarray) -> np.ndarray:
        config_key, family_key = pair_keys(x)
        r_c, n_c = self._config.lookup(config_key)
        r_f, n_f = self._family.lookup(family_key)
        n0 = self.prior_samples
        w_c = n_c / (n_c + n0)
        w_f = n_f / (n_f + n0)
        shift = w_c * r_c + (1.0 - w_c) * w_f * r_f
        return np.maximum(base * np.exp(shift), 1.0)

    # -- learning ----------------------------------------------------------------
    def learn(self, features: np.ndarray, observed: Sequence[float] | np.ndarray) -> np.ndarray:
        """Take a batch of labelled rows; returns the predictions made *before* learning them.

        Rows with a non-finite or < 1 label are ignored (a window with no
        progress says nothing about the pair).  One base call for the batch.
        """
        x = check_feature_batch(features)
        y = np.asarray(observed, dtype=np.float64)
        if y.shape != (x.shape[0],):
            raise ValueError(f"observed must have shape ({x.shape[0]},), got {y.shape}")
        if x.shape[0] == 0:
            return np.zeros(0)
        base = np.asarray(self.base.predict(x), dtype=np.float64)
        before = self._correct(x, base) if self.samples_seen else np.maximum(base, 1.0)
        ok = np.isfinite(y) & (y >= 1.0) & (y < 100.0)
        if ok.any():
            residual = np.log(y[ok]) - np.log(np.maximum(base[ok], 1.0))
            config_key, family_key = pair_keys(x[ok])
            self._config.add(config_key, residual)
            self._family.add(family_key, residual)
            self.samples_seen += int(ok.sum())
        return before

    @property
    def pairs(self) -> int:
        """Configuration pairs with at least one observation."""
        return len(self._config.table)

    # -- persistence -----------------------------------------------------------------
    def restore_rows(self, level: str, rows: Iterable[tuple[int, float, float]]) -> None:
        """Load [key, mean residual, count] rows into ``level`` ("config" or "family")."""
        target = self._config if level == "config" else self._family
        added = 0
        for key, mean, count in rows:
            if math.isfinite(mean) and math.isfinite(count) and count > 0:
                target.table[int(key)] = (float(mean), min(float(count), float(target.memory)))
                added += 1
        while len(target.table) > target.limit:
            target.table.popitem(last=False)
        target._dirty = True
        if level == "config":
            self.samples_seen += added

    def rows(self, level: str) -> list[tuple[int, float, float]]:
        """[key, mean residual, count] rows of ``level``, oldest update first."""
        table = (self._config if level == "config" else self._family).table
        return [(k, m, n) for k, (m, n) in table.items()]
