"""A predictor with the spec's IAC accuracy, for what-if runs against the ground truth.

:class:`NoisyTablePredictor` implements the core's ``SlowdownPredictor`` protocol
from the 36-dim features alone: it recognises each job block as a catalog
configuration (the catalog's feature rows are distinct) and answers the
simulator's true slowdown times a fixed per-pair log-normal error with
sigma = 0.095, i.e. a mean absolute percentage error of about 7.6%, the
accuracy the spec reports for its trained DNN (section 5.4).  It stands in for
a DNN trained on the measured pairs of this cluster; unrecognised rows fall back
to the core's :class:`ContentionPredictor`.

It is *not* the default: by default ElastiCo plans with the core
ContentionPredictor (or whatever predictor the caller passes), so that the
simulator measures the shipped system; the benchmark reports both.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.interference.predictor import ContentionPredictor, check_feature_batch
from elastico_extender.sim.truth import GroundTruth

__all__ = ["NoisyTablePredictor", "SampledPairsPredictor"]


class NoisyTablePredictor:
    name = "table-mape7.6"
    generation = 0  # a fixed table: its answers never change

    def __init__(self, truth: GroundTruth, sigma: float = 0.095, seed: int = 0) -> None:
        c = truth.configs
        self._lookup: dict[bytes, int] = {}
        for name, fam in c.families.items():
            feats = np.ascontiguousarray(fam.features[:, :14], dtype=np.float32)
            for r in range(fam.size):
                self._lookup.setdefault(feats[r].tobytes(), c.offset[name] + r)
        rng = np.random.default_rng([seed, 0x1AC])
        noise = np.exp(rng.normal(0.0, sigma, truth.slowdown.shape))
        self._table = np.maximum(truth.slowdown * noise, 1.0)
        self._fallback = ContentionPredictor()
        if sigma == 0.0:
            self.name = "ground-truth-oracle"  # the benchmark world's table, exactly

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = check_feature_batch(features)
        out = np.empty(x.shape[0])
        missing = []
        for k in range(x.shape[0]):
            a = self._lookup.get(x[k, :14].tobytes())
            b = self._lookup.get(x[k, 14:28].tobytes())
            if a is None or b is None:
                missing.append(k)
                out[k] = 1.0
            else:
                out[k] = self._table[a, b]
        if missing:
            idx = np.array(missing)
            out[idx] = self._fallback.predict(x[idx])
        return out


class SampledPairsPredictor:
    """A predictor *learned* the way the spec builds its training set (section 3.3.2).

    "Profiling 20-30% of all candidate pair combinations, stratified by workload
    type": a ``fraction`` of the unordered workload pairs is drawn within each
    co-location type (training+training, training+inference,
    inference+inference), and for each drawn pair ``configs_per_pair`` random
    configuration pairs are "measured" (their true slowdown, with the same
    per-pair measurement noise as :class:`NoisyTablePredictor`).  Prediction is
    distance-weighted k-nearest-neighbours in log-slowdown over the 36 standardised
    IAC features: pure numpy, no training framework.  Pairs of workloads never
    profiled are predicted from their neighbours, so this variant shows what a
    cluster gets from a partial profiling campaign, between the built-in heuristic
    and the spec-accuracy oracle.
    """

    name = "knn-sampled-pairs"
    generation = 0  # fixed samples: its answers never change
    CACHE_ROWS = 1 << 20
    """Most rows kept in the answer cache (~300 MiB at worst; a 24 h run at 64 GPUs uses ~5k)."""

    BLOCK = 32
    """Query rows per distance block: BLOCK x samples x 36 float64 (~15 MiB at 1,600 samples)."""

    def __init__(
        self,
        truth: GroundTruth,
        fraction: float = 0.25,
        configs_per_pair: int = 40,
        k: int = 5,
        seed: int = 0,
    ) -> None:
        from elastico_extender.core.interference.features import pair_features

        c = truth.configs
        rng = np.random.default_rng([seed, 0x5A3])
        workloads = len(c.names)
        gids = [np.flatnonzero(c.workload == w) for w in range(workloads)]
        inference = np.array([bool(c.is_inference[g[0]]) for g in gids])
        pairs = [(a, b) for a in range(workloads) for b in range(a, workloads)]
        chosen: list[tuple[int, int]] = []
        for kind in (0, 1, 2):
            stratum = [p for p in pairs if int(inference[p[0]]) + int(inference[p[1]]) == kind]
            take = max(1, round(fraction * len(stratum)))
            picks = rng.choice(len(stratum), size=min(take, len(stratum)), replace=False)
            chosen += [stratum[i] for i in picks]
        features = np.concatenate(
            [
                np.ascontiguousarray(c.families[n].features[:, :14], dtype=np.float32)
                for n in c.names
            ]
        )
        noise = np.exp(rng.normal(0.0, 0.095, truth.slowdown.shape))
        rows, labels = [], []
        for a, b in chosen:
            va = rng.choice(gids[a], size=configs_per_pair)
            vb = rng.choice(gids[b], size=configs_per_pair)
            for victim, partner in ((va, vb), (vb, va)):  # both jobs of each experiment
                rows.append(pair_features(features[victim], features[partner], 40.0))
                labels.append(
                    np.log(
                        np.maximum(truth.slowdown[victim, partner] * noise[victim, partner], 1.0)
                    )
                )
        x = np.concatenate(rows)
        self.samples = x.shape[0]
        self.profiled_pairs = len(chosen)
        std = x.std(axis=0)
        # Standardised in float64, so distances are exact and a row's answer does not
        # depend on the batch it came in.
        self._mean = x.mean(axis=0).astype(np.float64)
        self._scale = np.where(std > 1e-6, std, 1.0).astype(np.float64)
        self._x = (x.astype(np.float64) - self._mean) / self._scale
        self._y = np.concatenate(labels)
        self._k = k
        self._cache: dict[bytes, float] = {}

    def predict(self, features: np.ndarray) -> np.ndarray:
        """k-NN answers, each feature row computed once per predictor and then cached.

        The planner asks about the same (configuration, configuration, device) rows
        epoch after epoch (a 24 h run at 64 GPUs sends ~590k rows, ~4.8k distinct), so
        a row's answer is looked up by its float32 bytes; only rows never seen before
        reach :meth:`knn`.  The cache holds at most ``CACHE_ROWS`` rows (cleared when
        full), so memory stays bounded on any trace.
        """
        x = check_feature_batch(features)
        out = np.empty(x.shape[0])
        cache = self._cache
        keys = [row.tobytes() for row in x]
        todo: dict[bytes, int] = {}
        for i, key in enumerate(keys):
            hit = cache.get(key)
            if hit is None:
                todo.setdefault(key, i)
            else:
                out[i] = hit
        if todo:
            rows = np.fromiter(todo.values(), dtype=np.intp, count=len(todo))
            fresh = dict(zip(todo, self.knn(x[rows]).tolist(), strict=True))
            for i, key in enumerate(keys):
                if key in fresh:
                    out[i] = fresh[key]
            if len(cache) + len(fresh) > self.CACHE_ROWS:
                cache.clear()
            if len(fresh) <= self.CACHE_ROWS:
                cache.update(fresh)
        return out

    def knn(self, features: np.ndarray) -> np.ndarray:
        """Distance-weighted k-NN in log-slowdown, no cache: the definition of the answer.

        For each row z (standardised), the k training rows nearest in Euclidean
        distance d_i (exact, float64: a row's answer does not depend on the batch it
        came in) give ``max(1, exp(sum(y_i / (d_i + 1e-3)) / sum(1 / (d_i + 1e-3))))``.
        """
        z = (check_feature_batch(features).astype(np.float64) - self._mean) / self._scale
        out = np.empty(z.shape[0])
        for start in range(0, z.shape[0], self.BLOCK):  # bounded memory per block
            block = z[start : start + self.BLOCK]
            diff = block[:, None, :] - self._x[None, :, :]
            d2 = np.einsum("ijk,ijk->ij", diff, diff)
            near = np.argpartition(d2, self._k - 1, axis=1)[:, : self._k]
            dist = np.sqrt(np.take_along_axis(d2, near, axis=1)) + 1e-3
            weight = 1.0 / dist
            logs = (self._y[near] * weight).sum(axis=1) / weight.sum(axis=1)
            out[start : start + block.shape[0]] = np.exp(logs)
        return np.maximum(out, 1.0)
