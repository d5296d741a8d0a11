"""benchmarks/refused_pairs.py: the loop learns only the pairs it co-locates.  A pair its
predictor refuses stays refused at margin 1 (the loop as built); trials within a margin
find the harmless ones, and each harmful one tried is counted."""

from __future__ import annotations

import argparse

import pytest
from conftest import Constant, load_benchmark

NOISY = argparse.Namespace(windows=4, noise=0.03)


@pytest.fixture()
def refused_pairs(monkeypatch):
    return load_benchmark("refused_pairs", monkeypatch)


def test_a_pair_refused_everywhere_is_never_tried_so_never_learned(refused_pairs, v100_2019):
    out = refused_pairs.rounds(v100_2019, Constant(2.0), 1.5, 1.0, NOISY, seed=0)
    assert out.harmless > 0
    assert out.base_admits == out.admitted == out.harmful_tried == out.harmful_admitted == 0


def test_trials_within_the_margin_find_the_harmless_pairs_at_a_counted_cost(
    refused_pairs, v100_2019
):
    """Predicted 2.0 and tried up to 1.5 * 1.4 = 2.1: every pair is co-located once, so
    the observed ones are learned; the harmful ones tried are every harmful pair."""
    out = refused_pairs.rounds(v100_2019, Constant(2.0), 1.5, 1.4, NOISY, seed=0)
    units = int(refused_pairs.units(v100_2019).max()) + 1
    assert out.base_admits == 0
    assert out.admitted >= 0.9 * out.harmless  # near-tau pairs may read above it
    assert out.harmful_tried == units - out.harmless
    assert out.harmful_admitted <= 0.05 * out.harmful_tried


def test_main_prints_a_table_per_base(refused_pairs, capsys):
    args = ["--gpu", "v100", "--seeds", "0", "--margins", "1"]
    assert refused_pairs.main(args) == 0
    out = capsys.readouterr().out
    assert "328 measured pairs" in out
    assert "## shipped ONNX, tau 1.5" in out and "## heuristic, tau 1.5" in out
    assert out.count("| 1 | ") == 2
