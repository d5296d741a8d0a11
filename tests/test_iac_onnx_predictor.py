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


# -- models an operator might hand ``--predictor-model`` (built with the real onnx package) --


def _model_file(
    path,
    *,
    input_type: int | None = None,
    input_shape: tuple = ("N", NUM_FEATURES),
    output_shape: tuple | None = ("N", 1),
    body: str = "linear",
    opset: int = 17,
    metadata: dict[str, str] | None = None,
):
    """Write an ONNX graph ``features -> slowdown`` and return its path.

    ``body``: ``linear`` (1 + 0.01 * sum of the features), ``reduce`` (1 + the batch's
    mean: one number for the batch), ``two-rows`` (runs for a batch of two only),
    ``sqrt`` (1 + sqrt(0.5 - sm_active): NaN for a victim busier than half its SMs) or
    ``constant:<v>``."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    elem = TensorProto.FLOAT if input_type is None else input_type
    dtype = {TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64}.get(elem, np.int64)
    width = input_shape[-1] if isinstance(input_shape[-1], int) else NUM_FEATURES
    inits = [numpy_helper.from_array(np.array([1], dtype=dtype), "one")]
    if body.startswith("constant:"):
        inits.append(numpy_helper.from_array(np.zeros((width, 1), dtype=dtype), "W"))
        inits[0] = numpy_helper.from_array(np.array([float(body[9:])], dtype=dtype), "one")
        nodes = [helper.make_node("MatMul", ["features", "W"], ["mm"])]
    elif body == "two-rows":  # reshapes to a constant (2, 36): fails for any other batch
        inits += [
            numpy_helper.from_array(np.array([2, width], dtype=np.int64), "shape"),
            numpy_helper.from_array(np.full((width, 1), 0.01, dtype=dtype), "W"),
        ]
        nodes = [
            helper.make_node("Reshape", ["features", "shape"], ["two"]),
            helper.make_node("MatMul", ["two", "W"], ["mm"]),
        ]
    elif body == "reduce":
        nodes = [helper.make_node("ReduceMean", ["features"], ["mm"], keepdims=0)]
    elif body == "sqrt":
        pick = np.zeros((width, 1), dtype=dtype)
        pick[0, 0] = -1
        inits += [
            numpy_helper.from_array(pick, "W"),
            numpy_helper.from_array(np.array([0.5], dtype=dtype), "half"),
        ]
        nodes = [
            helper.make_node("MatMul", ["features", "W"], ["neg"]),
            helper.make_node("Add", ["neg", "half"], ["room"]),
            helper.make_node("Sqrt", ["room"], ["mm"]),
        ]
    else:
        inits.append(numpy_helper.from_array(np.full((width, 1), 0.01, dtype=dtype), "W"))
        nodes = [helper.make_node("MatMul", ["features", "W"], ["mm"])]
    nodes.append(helper.make_node("Add", ["mm", "one"], ["slowdown"]))
    graph = helper.make_graph(
        nodes,
        "bad",
        [helper.make_tensor_value_info("features", elem, list(input_shape))],
        [
            helper.make_tensor_value_info(
                "slowdown", elem, None if output_shape is None else list(output_shape)
            )
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    if metadata:
        helper.set_model_props(model, metadata)
    path.write_bytes(model.SerializeToString())
    return path


def _refused(path, *needles: str) -> str:
    """The model at ``path`` is refused at load: one line naming the file and each needle."""
    with pytest.raises(PredictorError) as info:
        OnnxSlowdownPredictor(path)
    chosen, reason = load_predictor(path)
    assert isinstance(chosen, ContentionPredictor)
    assert reason is not None and "\n" not in reason and str(path) in reason, reason
    for needle in needles:
        assert needle in str(info.value), str(info.value)
    return reason


def test_a_well_formed_model_loads(tmp_path):
    chosen, reason = load_predictor(_model_file(tmp_path / "ok.onnx"))
    assert reason is None and isinstance(chosen, OnnxSlowdownPredictor)


def test_a_model_fixed_to_batch_one_is_refused_at_load(tmp_path):
    """torch.onnx.export without dynamic_axes fixes the batch at 1: it would load, then fail
    every epoch's batched call (no plan at all), so it is refused where it is loaded."""
    path = _model_file(tmp_path / "b1.onnx", input_shape=(1, NUM_FEATURES), output_shape=(1, 1))
    _refused(path, "batch")


@pytest.mark.parametrize(
    ("shape", "needle"),
    [(("N", 1, NUM_FEATURES), "rank 3"), ((NUM_FEATURES,), "rank 1"), (("N", 35), "35")],
)
def test_a_model_of_the_wrong_input_rank_or_width_is_refused_at_load(tmp_path, shape, needle):
    _refused(_model_file(tmp_path / "shape.onnx", input_shape=shape, output_shape=None), needle)


@pytest.mark.parametrize("elem", ["DOUBLE", "INT64"])
def test_a_model_of_the_wrong_input_type_is_refused_at_load(tmp_path, elem):
    kind = getattr(pytest.importorskip("onnx").TensorProto, elem)
    path = _model_file(tmp_path / "type.onnx", input_type=kind)
    _refused(path, "tensor(float)", f"tensor({elem.lower()})")


def test_a_model_answering_one_number_per_batch_is_refused_at_load(tmp_path):
    """An output of shape () (a reduction over the batch) looks right for one row only."""
    _refused(_model_file(tmp_path / "scalar.onnx", output_shape=(), body="reduce"), "for 2 rows")


def test_rows_the_model_answers_nan_for_get_the_heuristic_not_an_error(tmp_path, gavel_rows):
    """A model that loads (its probe is fine) but answers NaN for some rows at run time
    used to raise, failing every epoch's plan from then on; those rows get the
    conservative heuristic instead and the rest the model's answer."""
    predictor = OnnxSlowdownPredictor(_model_file(tmp_path / "sqrt.onnx", body="sqrt"))
    rows = gavel_rows[:40]
    broken = rows[:, 0] > 0.5
    assert broken.any() and (~broken).any()
    out = predictor.predict(rows)
    assert np.isfinite(out).all() and (out >= 1.0).all()
    heuristic = ContentionPredictor().predict(rows)
    np.testing.assert_allclose(out[broken], heuristic[broken])
    model = 1.0 + np.sqrt(0.5 - rows[~broken, 0].astype(np.float64))
    np.testing.assert_allclose(out[~broken], model, rtol=1e-5)  # no domain metadata: in domain


def test_a_model_failing_at_run_time_leaves_the_batch_to_the_heuristic(tmp_path, gavel_rows):
    predictor = OnnxSlowdownPredictor(_model_file(tmp_path / "two.onnx", body="two-rows"))
    rows = gavel_rows[:5]
    np.testing.assert_allclose(predictor.predict(rows), ContentionPredictor().predict(rows))


def test_a_model_onnxruntime_cannot_read_is_one_plain_line(tmp_path):
    """onnxruntime's refusal spans lines and carries its C++ source location and function
    signature; the reason shown in /healthz and the metric label is one plain line."""
    path = _model_file(tmp_path / "ir.onnx")
    model = path.read_bytes()
    onnx = pytest.importorskip("onnx")
    proto = onnx.load_from_string(model)
    proto.ir_version = 99  # newer than any onnxruntime reads
    path.write_bytes(proto.SerializeToString())
    reason = _refused(path, "IR version: 99")
    assert (
        "onnxruntime::" not in reason and ".cc:" not in reason and "ONNXRuntimeError" not in reason
    )


def test_a_file_too_large_for_a_slowdown_model_is_refused_before_it_is_read(tmp_path):
    """The wrong file (an LLM's ONNX export, gigabytes) would be read whole into the
    extender's memory before its signature is checked; its size refuses it first."""
    from elastico_extender.interference.onnx_predictor import MAX_MODEL_BYTES

    huge = tmp_path / "llm.onnx"
    with huge.open("wb") as handle:  # sparse: no disk used
        handle.truncate(MAX_MODEL_BYTES + 1)
    _refused(huge, f"{MAX_MODEL_BYTES + 1} bytes")


def test_unreadable_training_metadata_is_refused_naming_the_key(tmp_path):
    """A model whose ``trained_colocation_types`` is not a list of 0/1/2 escaped as a bare
    ValueError (int() of the text): the reason named neither the key nor the model."""
    meta = {"trained_colocation_types": "training+training"}
    path = _model_file(tmp_path / "meta.onnx", metadata=meta)
    _refused(path, "trained_colocation_types", "training+training")


def test_a_directory_given_as_the_model_is_named_as_one(tmp_path):
    """The chart's mount with an empty ``predictor.key`` names the mount directory: the
    reason said the model was not found where the operator sees it exist."""
    reason = _refused(tmp_path, "is a directory")
    assert "not found" not in reason


def test_the_service_given_a_batch_one_model_plans_on_the_heuristic_and_says_why(tmp_path):
    """End to end (real uvicorn): ``predictor_model`` naming a model fixed to batch 1 used
    to load as healthy and fail every epoch; now /healthz names the file and the problem
    and the epochs plan with the heuristic."""
    import httpx

    from elastico_extender.api.app import create_app
    from elastico_extender.cluster.embedded import EmbeddedCluster
    from elastico_extender.service.server import ServerThread
    from elastico_extender.service.settings import ServiceSettings

    path = _model_file(tmp_path / "b1.onnx", input_shape=(1, NUM_FEATURES), output_shape=(1, 1))
    settings = ServiceSettings(epoch_seconds=60, predictor_model=str(path))
    server = ServerThread(create_app(settings, EmbeddedCluster.from_file())).start()
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert str(path) in health["degraded_predictor"]
        assert "fixed batch dimension 1" in health["degraded_predictor"]
        published = httpx.get(f"{server.url}/plan").json()
        assert published["epoch"] >= 1 and published["predictor_degraded"]
        assert published["assignments"], published
    finally:
        server.stop()


def test_the_heuristic_chosen_as_the_base_is_healthy():
    """``predictor_model: heuristic``: an operator whose pairs are unlike the shipped model's
    training table chooses the heuristic (it transfers better to Lucid's pairs); that is
    a choice, not a degradation, and the online correction still stands in front of it."""
    import httpx

    from elastico_extender.api.app import create_app
    from elastico_extender.cluster.embedded import EmbeddedCluster
    from elastico_extender.core.interference.predictor import ContentionPredictor
    from elastico_extender.service.predictor import HEURISTIC, resolve_predictor
    from elastico_extender.service.server import ServerThread
    from elastico_extender.service.settings import ServiceSettings

    predictor, reason = resolve_predictor(HEURISTIC)
    assert isinstance(predictor, ContentionPredictor) and reason is None
    settings = ServiceSettings(epoch_seconds=60, predictor_model=HEURISTIC)
    server = ServerThread(create_app(settings, EmbeddedCluster.from_file())).start()
    try:
        health = httpx.get(f"{server.url}/healthz").json()
        assert not health.get("degraded_predictor"), health
        assert "heuristic" in str(health["predictor"]), health
        published = httpx.get(f"{server.url}/plan").json()
        assert published["epoch"] >= 1 and not published["predictor_degraded"]
    finally:
        server.stop()


def test_a_model_path_that_is_a_fifo_is_named_as_such_not_missing(tmp_path) -> None:
    """`--predictor-model` naming a FIFO was reported as "file not found"."""
    import os

    from elastico_extender.interference.onnx_predictor import load_predictor

    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    predictor, why = load_predictor(fifo)
    assert why is not None and f"{fifo} is not a regular file" in why
    assert predictor.name == "contention-heuristic"
