"""The learned k-NN predictor: its cached fast path answers as the brute-force definition."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.interference.features import pair_features
from elastico_extender.sim.predictors import SampledPairsPredictor
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable


@pytest.fixture(scope="module")
def learned() -> SampledPairsPredictor:
    configs = ConfigTable.build(0, 0.05)
    return SampledPairsPredictor(GroundTruth.build(configs), seed=0)


def _brute_force(p: SampledPairsPredictor, x: np.ndarray) -> np.ndarray:
    """One row at a time: every distance, a full stable sort, the k nearest."""
    train = p._x
    out = []
    for row in np.asarray(x, dtype=np.float32):
        z = (row.astype(np.float64) - p._mean) / p._scale
        dist = np.sqrt(((train - z) ** 2).sum(axis=1))
        near = np.argsort(dist, kind="stable")[: p._k]
        weight = 1.0 / (dist[near] + 1e-3)
        out.append(max(1.0, float(np.exp((p._y[near] * weight).sum() / weight.sum()))))
    return np.array(out)


def _catalog_rows(rng: np.random.Generator, n: int, jitter: float) -> np.ndarray:
    configs = ConfigTable.build(0, 0.05)
    feats = np.concatenate([configs.families[n].features[:, :14] for n in configs.names])
    a, b = rng.integers(0, configs.size, n), rng.integers(0, configs.size, n)
    x = pair_features(feats[a], feats[b], rng.choice([16.0, 40.0, 80.0], n))
    return x * (1.0 + jitter * rng.standard_normal(x.shape)).astype(np.float32)


@pytest.mark.parametrize("jitter", [0.0, 0.01, 0.3])
def test_cached_fast_path_answers_as_brute_force(
    learned: SampledPairsPredictor, jitter: float
) -> None:
    rng = np.random.default_rng(11)
    rows = _catalog_rows(rng, 150, jitter)
    expected = _brute_force(learned, rows)
    learned._cache.clear()
    # Repeated rows, in batches of varying size, some answered from the cache.
    order = rng.integers(0, rows.shape[0], 600)
    got = np.concatenate([learned.predict(rows[chunk]) for chunk in np.array_split(order, 37)])
    np.testing.assert_allclose(got, expected[order], rtol=1e-12)
    assert len(learned._cache) == np.unique(rows[np.unique(order)], axis=0).shape[0]
    np.testing.assert_allclose(learned.knn(rows), expected, rtol=1e-12)


def test_training_rows_are_answered_near_their_own_label(
    learned: SampledPairsPredictor,
) -> None:
    """A profiled row sits at distance 0: weight 1/1e-3 dominates its k-1 neighbours."""
    train = (learned._x * learned._scale + learned._mean).astype(np.float32)
    pick = np.random.default_rng(3).integers(0, train.shape[0], 50)
    got = learned.predict(train[pick])
    np.testing.assert_allclose(got, _brute_force(learned, train[pick]), rtol=1e-12)


def test_cache_is_bounded_and_empty_batches_work(
    learned: SampledPairsPredictor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(SampledPairsPredictor, "CACHE_ROWS", 64)
    learned._cache.clear()
    rows = _catalog_rows(np.random.default_rng(5), 200, 0.1)
    for chunk in np.array_split(np.arange(200), 10):
        learned.predict(rows[chunk])
        assert len(learned._cache) <= 64
    assert learned.predict(np.zeros((0, 36), dtype=np.float32)).shape == (0,)
    np.testing.assert_allclose(learned.predict(rows), _brute_force(learned, rows), rtol=1e-12)


def test_the_truth_oracle_answers_the_ground_truth_and_iac_does_not():
    """``elastico+truth`` (the ceiling of interference knowledge) plans with the exact
    benchmark-world slowdowns; ``elastico+iac`` with the spec's 7.6% error."""
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.runner import Experiment, _world, build_policy

    exp = Experiment(trace=(), cluster=ClusterSpec(gpus=8), seed=0)
    configs, truth = _world(exp)
    feats = np.concatenate([configs.families[n].features[:, :14] for n in configs.names])
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, configs.size, 200), rng.integers(0, configs.size, 200)
    x = pair_features(feats[a], feats[b], np.full(200, 40.0))
    exact = np.maximum(truth.slowdown[a, b], 1.0)
    oracle = build_policy("elastico+truth", exp, truth).predictor
    assert oracle is not None and oracle.name == "ground-truth-oracle"
    np.testing.assert_allclose(oracle.predict(x), exact, rtol=1e-6)
    iac = build_policy("elastico+iac", exp, truth).predictor
    assert iac is not None and not np.allclose(iac.predict(x), exact, rtol=1e-3)
    with pytest.raises(ValueError, match="suffix"):
        build_policy("elastico+oracle", exp, truth)
