"""Training + ONNX export round trip: onnxruntime reproduces the torch model."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from elastico_extender.interference.dataset import load_pairs, shipped_csv  # noqa: E402
from elastico_extender.interference.onnx_predictor import OnnxSlowdownPredictor  # noqa: E402
from elastico_extender.interference.train import (  # noqa: E402
    TrainConfig,
    export_onnx,
    fit,
    main,
    predict_torch,
)


@pytest.fixture(scope="module")
def small():
    data = load_pairs(shipped_csv())
    return data.subset(np.arange(len(data)) < 200)


def test_export_round_trip_matches_torch(small, tmp_path):
    net = fit(small.x, small.y, TrainConfig(hidden=16, epochs=3, batch_size=32))
    path = tmp_path / "m.onnx"
    diff = export_onnx(net, path, small.x, {"trained_colocation_types": "0"})
    assert diff < 1e-4
    served = OnnxSlowdownPredictor(path).predict(small.x)
    np.testing.assert_allclose(served, np.maximum(predict_torch(net, small.x), 1.0), atol=1e-4)
    assert (served >= 1.0).all()


def test_constant_columns_are_ignored_by_the_trained_model(small):
    net = fit(small.x, small.y, TrainConfig(hidden=16, epochs=2, batch_size=32))
    changed = small.x[:10].copy()
    changed[:, 10] = 1.0  # AMP: never set in Gavel data
    np.testing.assert_allclose(predict_torch(net, changed), predict_torch(net, small.x[:10]))


def test_cli_trains_and_writes_a_servable_model(tmp_path, capsys):
    csv = tmp_path / "pairs.csv"
    lines = shipped_csv().read_text().splitlines()
    csv.write_text("\n".join(lines[:80]) + "\n")
    out = tmp_path / "cli.onnx"
    assert main(["--csv", str(csv), "--out", str(out), "--epochs", "2", "--hidden", "8"]) == 0
    assert "export check" in capsys.readouterr().out
    assert OnnxSlowdownPredictor(out).predict(load_pairs(csv).x).min() >= 1.0


def test_train_iac_reads_lucids_two_tables_together(lucid_tables, tmp_path, capsys):
    """``elastico train-iac --csv colocate_info.csv --csv single_data.csv``: the model
    trains on the pairs with the solo table's counters, and serves them."""
    pair_file, solo_file = lucid_tables
    out = tmp_path / "lucid.onnx"
    argv = ["--csv", str(pair_file), "--csv", str(solo_file), "--out", str(out), "--epochs", "3"]
    assert main(argv) == 0
    assert "trained on 24 rows (11 job pairs)" in capsys.readouterr().out
    served = OnnxSlowdownPredictor(out).predict(load_pairs([pair_file, solo_file]).x)
    assert served.shape == (24,) and (served >= 1.0).all()
