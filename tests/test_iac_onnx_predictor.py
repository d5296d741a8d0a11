"""The shipped IAC DNN served by real onnxruntime, its validation and its fallback."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.interference.features import NUM_FEATURES, job_features, pair_features
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import load_pairs, shipped_csv
from elastico_extender.interference.onnx_predictor import (
    DEFAULT_MODEL_PATH,
    OnnxSlowdownPredictor,
    load_predictor,
)


@pytest.fixture(scope="module")
def predictor() -> OnnxSlowdownPredictor:
    return OnnxSlowdownPredictor()


@pytest.fixture(scope="module")
def gavel_rows() -> np.ndarray:
    return load_pairs(shipped_csv()).x


def test_shipped_model_is_small_and_implements_the_protocol(predictor):
    assert DEFAULT_MODEL_PATH.stat().st_size < 1_000_000
    assert isinstance(predictor, SlowdownPredictor)
    assert predictor.metadata["trained_colocation_types"] == "0"


def test_batched_predictions_have_shape_and_are_at_least_one(predictor, gavel_rows):
    out = predictor.predict(gavel_rows)
    assert out.shape == (gavel_rows.shape[0],)
    assert np.isfinite(out).all() and (out >= 1.0).all()
    assert out.std() > 0.05  # the model distinguishes pairs, it is not a constant


def test_predictions_are_deterministic_and_batch_independent(predictor, gavel_rows):
    whole = predictor.predict(gavel_rows)
    assert np.array_equal(whole, predictor.predict(gavel_rows))
    one_by_one = np.array([predictor.predict(row[None, :])[0] for row in gavel_rows[:20]])
    np.testing.assert_allclose(one_by_one, whole[:20], rtol=1e-5)


def test_model_tracks_real_slowdowns(predictor):
    data = load_pairs(shipped_csv())
    pred = predictor.predict(data.x)
    assert np.corrcoef(np.log(pred), np.log(data.y))[0, 1] > 0.8


def test_empty_batch_gives_empty_result(predictor):
    assert predictor.predict(np.zeros((0, NUM_FEATURES), dtype=np.float32)).shape == (0,)


def test_nan_features_raise_predictor_error(predictor, gavel_rows):
    rows = gavel_rows[:4].copy()
    rows[2, 5] = np.nan
    with pytest.raises(PredictorError, match="NaN"):
        predictor.predict(rows)


def test_out_of_range_features_are_all_named(predictor, gavel_rows):
    rows = gavel_rows[:4].copy()
    rows[1, 0] = 1.7  # sm_active is a fraction
    rows[3, 32] = 5.0  # no such co-location type
    with pytest.raises(PredictorError) as info:
        predictor.predict(rows)
    assert "self_sm_active" in str(info.value) and "colocation_type" in str(info.value)


def test_wrong_shape_raises_predictor_error(predictor):
    with pytest.raises(PredictorError, match="shape"):
        predictor.predict(np.zeros((3, 35), dtype=np.float32))


def test_unseen_colocation_type_is_never_below_the_heuristic(predictor):
    hw = np.array([[0.6, 0.6, 0.7, 10.0, 0.3]])
    train = job_features(
        hardware=hw,
        is_inference=False,
        param_count=25e6,
        throughput=np.array([100.0]),
        batch_size=np.array([64]),
    )
    infer = job_features(
        hardware=hw,
        is_inference=True,
        param_count=7e9,
        throughput=np.array([900.0]),
        input_len=np.array([512]),
        output_len=np.array([128]),
    )
    rows = pair_features(np.vstack([train, infer]), np.vstack([infer, train]), 40.0)
    assert set(rows[:, 32]) == {1.0}
    out = predictor.predict(rows)
    assert (out >= ContentionPredictor().predict(rows) - 1e-9).all()


def test_load_predictor_returns_the_dnn_when_the_model_is_fine():
    chosen, reason = load_predictor()
    assert isinstance(chosen, OnnxSlowdownPredictor) and reason is None


def test_missing_model_falls_back_with_reason(tmp_path):
    chosen, reason = load_predictor(tmp_path / "nope.onnx")
    assert isinstance(chosen, ContentionPredictor)
    assert reason is not None and "not found" in reason and "contention-heuristic" in reason


def test_corrupt_model_falls_back_with_reason(tmp_path):
    bad = tmp_path / "iac.onnx"
    bad.write_bytes(DEFAULT_MODEL_PATH.read_bytes()[:500])
    with pytest.raises(PredictorError, match="cannot load"):
        OnnxSlowdownPredictor(bad)
    chosen, reason = load_predictor(bad)
    assert isinstance(chosen, ContentionPredictor) and reason and "cannot load" in reason
    assert (chosen.predict(np.full((2, NUM_FEATURES), 0.5, dtype=np.float32)) >= 1.0).all()


def test_pairs_outside_the_training_domain_are_never_predicted_safer_than_the_heuristic():
    """The shipped model saw only Gavel's FP32 training pairs (no memory counter): catalog
    A100 pairs are out of its domain, so the guard answers at least the heuristic."""
    from elastico_extender.core.interference.features import pair_features
    from elastico_extender.core.interference.predictor import ContentionPredictor
    from elastico_extender.core.shapes.catalog import catalog_families
    from elastico_extender.interference import load_predictor
    from elastico_extender.interference.dataset import load_pairs, shipped_csv

    predictor, reason = load_predictor(None)
    assert reason is None
    families = catalog_families()
    rows = [families[n].features[: families[n].size : 5] for n in ("bert", "resnet50", "ncf")]
    victims = np.concatenate(rows)
    partners = victims[::-1]
    x = pair_features(victims, partners, 40.0)
    assert np.all(predictor.predict(x) >= ContentionPredictor().predict(x) - 1e-9)
    # ... while the training rows themselves are served by the DNN alone
    data = load_pairs(shipped_csv())
    low, high = predictor._domain
    assert np.all((data.x >= low) & (data.x <= high))
