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
  residual r_f over n_f samples: what a configuration pair of a known
  family pair that was never observed falls back on.

Nearest neighbours (the third level) answer for every configuration pair never
observed.  Where its family pair has evidence they refine the family mean: the
configurations of one family pair can differ widely (a larger batch can double
the harm), and on real pair measurements the observed configuration beside a
new one predicts it better than the family's mean (``benchmarks/online_transfer.py``).
Where the family pair has none, they are all there is.
The correction keeps a capped ring (``neighbours`` slots, oldest new pair
overwritten first) of the observed configuration pairs: each pair's feature
row with its level-1 mean residual and count.  For a row x never observed the
``NEIGHBOURS`` = 8 stored rows nearest in standardised feature space
(per-column scale: the ring's standard deviation, at least ``MIN_SCALE``;
distance d: root mean square over the 36 columns) give::

    k_i  = exp(-(d_i / BANDWIDTH)^2 / 2)  for d_i <= RADIUS, else 0
    n_nn = sum k_i n_i,  r_nn = sum k_i n_i r_i / n_nn
    w_nn = n_nn / (n_nn + n0) * max_i k_i

so the borrowed shift shrinks toward the level below it with distance (even
unlimited evidence counts only as much as its nearest row's kernel) and with
little evidence, and a row farther than ``RADIUS`` from every observed pair
gets no share of it.

The answer for a row is, level by level (configuration pair, then nearest
neighbours, then family pair, then the base model)::

    log S = log base(x) + w_c * r_c + (1 - w_c) * w_f * r_f             (n_c > 0)
    log S = log base(x) + w_nn * r_nn + (1 - w_nn) * w_f * r_f          (n_c = 0)
    w = n / (n + n0)   (w_f = 0 when n_f = 0)

so a seen configuration pair converges to its observed (mean log) slowdown as
evidence accumulates, a new configuration of a seen family pair follows the
observed configurations beside it and, away from them, its family pair's shrunk
residual, an unseen family pair near observed pairs borrows their residual, and
an unseen family pair far from all of them gets the base answer unchanged.
n0 (``prior_samples``) is how many observations the base prediction is worth.
Counts are capped at ``memory`` samples, after which a mean becomes an
exponentially weighted one (a drifting workload is followed).

Rows are keyed by a 64-bit hash of their float32 bytes computed in numpy, and
looked up with ``searchsorted``: one vectorised call per batch, and the base
answer untouched (zero overhead) while nothing has been learned.  The
neighbour search runs only on the batch's distinct rows never observed, as one
matrix product against the ring (at most ``neighbours`` x 36), in chunks of
bounded memory.  The state is bounded (``max_pairs`` configuration pairs,
least recently updated dropped; ``neighbours`` ring slots, 0 turning the level off) and plain rows
(:meth:`rows` / :meth:`restore_rows`, :meth:`neighbour_rows` /
:meth:`restore_neighbours`), so a driver persists it.

What it learns is chosen by the driver's loop (``core.closed_loop``, ``ClosedLoop.label``):
one sample per window that labels a pair; windows where two partners share one
device with the victim (their excesses add up) teach nothing.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.core.interference.predictor import (
    SlowdownPredictor,
    check_feature_batch,
    predictor_generation,
)
from elastico_extender.core.observations import PairSample

__all__ = ["FAMILY_COLUMNS", "OnlineCorrection", "pair_keys", "single_partner"]

CONFIG_COLUMNS = 28
"""Columns identifying a configuration pair: both 14-column job blocks."""
FAMILY_COLUMNS = (5, 6, 19, 20)
"""Columns identifying a family pair: each job's is_inference and log10_params."""
NEIGHBOURS = 8
"""Stored pairs a neighbour estimate averages over (the nearest ones)."""
BANDWIDTH = 0.25
"""Kernel width, in standardised root-mean-square distance (module doc)."""
RADIUS = 0.75
"""Stored pairs farther than this lend nothing (3 bandwidths: kernel < 1.2%)."""
MIN_SCALE = 0.1
"""Floor of a column's scale: a column constant over the ring still tells pairs apart."""
_CHUNK = 256
"""Query rows per distance block (bounds the block to _CHUNK x ring floats)."""
BORROWED_KEPT = 100_000
"""Neighbour answers remembered between learning steps (the planner asks a row often)."""

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


def _is_key(key: int) -> bool:
    """Whether ``key`` is a pair key :func:`pair_keys` can produce (an unsigned 64-bit
    integer), so a restored row fits the uint64 arrays the lookups build."""
    return 0 <= int(key) < 2**64


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
            # Flag first, then one copy of the table (a single C-level call): a driver
            # thread learning or restoring meanwhile marks it dirty again, never breaks it.
            self._dirty = False
            items = sorted(self.table.items())
            self._keys = np.array([k for k, _ in items], dtype=np.uint64)
            self._mean = np.array([v[0] for _, v in items])
            self._count = np.array([v[1] for _, v in items])
        mean = np.zeros(keys.size)
        count = np.zeros(keys.size)
        if self._keys.size == 0 or keys.size == 0:
            return mean, count
        at = np.minimum(np.searchsorted(self._keys, keys), self._keys.size - 1)
        hit = self._keys[at] == keys
        mean[hit] = self._mean[at[hit]]
        count[hit] = self._count[at[hit]]
        return mean, count


class _Ring:
    """Capped ring of observed configuration pairs: feature row, mean residual, count."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.x = np.zeros((capacity, NUM_FEATURES), dtype=np.float32)
        self.mean = np.zeros(capacity)
        self.count = np.zeros(capacity)
        self.keys: list[int] = []
        self.slot: dict[int, int] = {}
        self.next = 0
        self._scaled: np.ndarray | None = None  # standardised ring (size, 36)
        self._scaled_sq = np.zeros(0)
        self._center = np.zeros(NUM_FEATURES)
        self._scale = np.ones(NUM_FEATURES)

    @property
    def size(self) -> int:
        return len(self.keys)

    def put(self, key: int, row: np.ndarray, mean: float, count: float) -> None:
        at = self.slot.get(key)
        if at is None:
            at = self.next
            if at < len(self.keys):
                del self.slot[self.keys[at]]
                self.keys[at] = key
            else:
                self.keys.append(key)
            self.slot[key] = at
            self.next = (at + 1) % self.capacity
            self.x[at] = row
            self._scaled = None  # the standardisation follows the rows, not their means
        self.mean[at] = mean
        self.count[at] = count

    def _standardised(self) -> np.ndarray:
        if self._scaled is None:
            x = self.x[: self.size].astype(np.float64)
            self._center = x.mean(axis=0)
            self._scale = np.maximum(x.std(axis=0), MIN_SCALE)
            z = (x - self._center) / self._scale
            self._scaled = np.ascontiguousarray(z)
            self._scaled_sq = (z**2).sum(axis=1)
        return self._scaled

    def query(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(r_nn, n_nn, max kernel) per row (module doc); 0, 0, 0 where nothing is near."""
        ring = self._standardised()
        size = ring.shape[0]
        k = min(NEIGHBOURS, size)
        ring_sq = self._scaled_sq
        shift = np.zeros(rows.shape[0])
        evidence = np.zeros(rows.shape[0])
        nearest = np.zeros(rows.shape[0])
        for lo in range(0, rows.shape[0], _CHUNK):
            z = (rows[lo : lo + _CHUNK].astype(np.float64) - self._center) / self._scale
            # One matrix-vector product per row: a matrix product of this shape goes
            # multi-threaded in OpenBLAS, which costs far more than it saves here.
            dot = np.empty((z.shape[0], size))
            for i in range(z.shape[0]):
                dot[i] = ring @ z[i]
            d2 = (z**2).sum(axis=1)[:, None] + ring_sq[None, :] - 2.0 * dot
            d2 = np.maximum(d2, 0.0) / NUM_FEATURES
            if k < size:
                near = np.argpartition(d2, k - 1, axis=1)[:, :k]
            else:
                near = np.broadcast_to(np.arange(size), d2.shape)
            d2k = np.take_along_axis(d2, near, axis=1)
            kernel = np.where(d2k <= RADIUS**2, np.exp(-0.5 * d2k / BANDWIDTH**2), 0.0)
            weight = kernel * self.count[near]
            total = weight.sum(axis=1)
            has = total > 0
            block = slice(lo, lo + z.shape[0])
            shift[block][has] = (weight[has] * self.mean[near][has]).sum(axis=1) / total[has]
            evidence[block] = total
            nearest[block] = kernel.max(axis=1)
        return shift, evidence, nearest


class OnlineCorrection:
    """A :class:`SlowdownPredictor` that corrects ``base`` by observed slowdowns (module doc)."""

    def __init__(
        self,
        base: SlowdownPredictor,
        *,
        prior_samples: float = 1.0,
        memory: int = 50,
        max_pairs: int = 200_000,
        neighbours: int = 2048,
    ) -> None:
        if prior_samples <= 0 or memory < 1 or max_pairs < 1 or neighbours < 0:
            raise ValueError("prior_samples must be > 0, memory and max_pairs >= 1")
        self.base = base
        self.name = f"{getattr(base, 'name', type(base).__name__)}+online"
        self.prior_samples = float(prior_samples)
        self._config = _Level(memory, max_pairs)
        self._family = _Level(memory, max(1, max_pairs // 10))
        self._ring = _Ring(neighbours)  # 0: no neighbour level
        # key -> the neighbour level's (shift, weight), kept until the ring changes
        self._borrowed: dict[int, tuple[float, float]] = {}
        self.samples_seen = 0
        self._changes = 0  # bumped after every change to what it answers (``generation``)

    # -- the predictor protocol ------------------------------------------------
    @property
    def generation(self) -> int | None:
        """Grows whenever an answer can change (learning, a restore), so a caller may keep
        answers while it stays put; None when the base predictor declares none.

        Bumped after the change is applied: a reader that sees the old value and reads
        new answers meanwhile only keeps them until its next look at the generation.
        """
        base = predictor_generation(self.base)
        return None if base is None else base + self._changes

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
        family = n_f / (n_f + n0) * r_f
        shift = w_c * r_c + (1.0 - w_c) * family
        unseen = n_c == 0
        if self._ring.size and unseen.any():
            borrowed, weight = self._borrow(x[unseen], config_key[unseen])
            shift[unseen] = borrowed + (1.0 - weight) * family[unseen]
        return np.maximum(base * np.exp(shift), 1.0)

    def _borrow(self, x: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The neighbour level's (w_nn * r_nn, w_nn), computed once per distinct row."""
        distinct, first, back = np.unique(keys, return_index=True, return_inverse=True)
        cache = self._borrowed
        known = [cache.get(k, (math.nan, math.nan)) for k in distinct.tolist()]
        shift = np.array([s for s, _ in known])
        weight = np.array([w for _, w in known])
        todo = np.isnan(shift)
        if todo.any():
            r_nn, n_nn, nearest = self._ring.query(x[first[todo]])
            weight[todo] = n_nn / (n_nn + self.prior_samples) * nearest
            shift[todo] = weight[todo] * r_nn
            if len(cache) > BORROWED_KEPT:
                cache.clear()
            answers = zip(shift[todo].tolist(), weight[todo].tolist(), strict=True)
            cache.update(zip(distinct[todo].tolist(), answers, strict=True))
        back = back.reshape(-1)
        return shift[back], weight[back]

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
            table = self._config.table
            self._borrowed.clear()
            for row, key in zip(x[ok], config_key.tolist(), strict=True):
                if key in table and self._ring.capacity:
                    self._ring.put(key, row, *table[key])
            self.samples_seen += int(ok.sum())
            self._changes += 1
        return before

    def observed_windows(self, features: np.ndarray) -> np.ndarray:
        """Windows learned per row's configuration pair (capped at ``memory``; 0: never
        observed), so a caller can tell an observed slowdown from a predicted one."""
        x = check_feature_batch(features)
        return self._config.lookup(pair_keys(x)[0])[1]

    @property
    def pairs(self) -> int:
        """Configuration pairs with at least one observation."""
        return len(self._config.table)

    # -- persistence -----------------------------------------------------------------
    def restore_rows(self, level: str, rows: Iterable[tuple[int, float, float]]) -> None:
        """Load [key, mean residual, count] rows into ``level`` ("config" or "family").
        A row whose key is no 64-bit pair key, or whose numbers are not finite with a
        positive count, is skipped (the lookup's uint64 table could not hold it)."""
        target = self._config if level == "config" else self._family
        added = 0
        for key, mean, count in rows:
            if _is_key(key) and math.isfinite(mean) and math.isfinite(count) and count > 0:
                target.table[int(key)] = (float(mean), min(float(count), float(target.memory)))
                added += 1
        while len(target.table) > target.limit:
            target.table.popitem(last=False)
        target._dirty = True
        if level == "config":
            self.samples_seen += added
        self._changes += 1

    def neighbour_rows(self) -> list[tuple[int, np.ndarray, float, float]]:
        """The ring's [key, feature row (float32), mean residual, count], oldest slot first."""
        ring = self._ring
        order = list(range(ring.next, ring.size)) + list(range(ring.next))
        return [(ring.keys[i], ring.x[i].copy(), ring.mean[i], ring.count[i]) for i in order]

    def restore_neighbours(self, rows: Iterable[tuple[int, np.ndarray, float, float]]) -> None:
        """Load :meth:`neighbour_rows` output (oldest first; rows of the wrong shape skipped)."""
        for key, row, mean, count in rows:
            x = np.asarray(row, dtype=np.float32)
            ok = x.shape == (NUM_FEATURES,) and np.isfinite(x).all() and self._ring.capacity > 0
            ok = ok and _is_key(key)
            if ok and math.isfinite(mean) and math.isfinite(count) and count > 0:
                self._ring.put(int(key), x, float(mean), float(count))
        self._borrowed.clear()
        self._changes += 1

    def rows(self, level: str) -> list[tuple[int, float, float]]:
        """[key, mean residual, count] rows of ``level``, oldest update first."""
        table = (self._config if level == "config" else self._family).table
        return [(k, m, n) for k, (m, n) in table.items()]
