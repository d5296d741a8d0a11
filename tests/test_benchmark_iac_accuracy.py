"""benchmarks/iac_accuracy.py on another lab's measurements (``--pairs``): the shipped
model and the heuristic as served, then the fitted models, with no noise floor (it needs
Gavel's two campaigns); a file it cannot read is an error naming the option."""

from __future__ import annotations

import pytest
from conftest import load_benchmark


@pytest.fixture()
def iac_accuracy(monkeypatch):
    return load_benchmark("iac_accuracy", monkeypatch)


def test_another_labs_tables_get_the_served_models_and_the_fitted_ones(
    iac_accuracy, lucid_tables, capsys
):
    pair_file, solo_file = lucid_tables
    args = ["--no-dnn", "--pairs", str(pair_file), "--pairs", str(solo_file)]
    assert iac_accuracy.main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("$ python benchmarks/iac_accuracy.py --no-dnn --pairs ")
    assert "24 rows = 11 job pairs" in out and "colocate_info.csv, single_data.csv" in out
    assert "As served: no fitting on these measurements" in out
    assert "shipped ONNX: Spearman rank correlation" in out
    assert "heuristic: Spearman rank correlation" in out
    assert "Leave-one-workload-out (3 model families)" in out
    assert "  on rtx3090" in out and "Noise floor" not in out
    assert "nan" not in out


def test_a_pair_file_it_cannot_read_names_the_option(iac_accuracy, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("gpu,job_a\nk80,x\n")
    with pytest.raises(SystemExit) as exit_:
        iac_accuracy.main(["--no-dnn", "--pairs", str(bad)])
    assert exit_.value.code == 2
    assert "--pairs: pair CSV" in capsys.readouterr().err
