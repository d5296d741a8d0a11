"""benchmarks/online_transfer.py: the online correction on a pair CSV the shipped model was
not trained on (Gavel's 2019 campaign, real measurements).  Its three kinds of rows cover
every row once, and what it reports moves as the loop should: pairs observed converge,
a family far from every observed pair keeps the base answer."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from conftest import load_benchmark

from elastico_extender.core.interference.online import pair_keys
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.interference.dataset import load_pairs, shipped_csv

NOISY = argparse.Namespace(windows=4, noise=0.03)


@pytest.fixture()
def online_transfer(monkeypatch):
    return load_benchmark("online_transfer", monkeypatch)


def test_observed_pairs_converge_and_the_kinds_cover_every_row(online_transfer, v100_2019):
    everything = 10**6
    curve = online_transfer.learning_curve(
        v100_2019, ContentionPredictor(), [10, everything], NOISY, seed=0
    )
    early = curve[10]
    assert sum(r.rows for r in early.values()) == len(v100_2019)
    assert early["observed"].rows == 20  # ten pairs, both directions
    assert early["observed"].corrected < 6.0 < early["observed"].base
    last = curve[max(curve)]
    assert last["observed"].rows == len(v100_2019)
    assert last["family seen"].rows == last["family unseen"].rows == 0


def test_a_held_out_family_far_from_every_observed_pair_keeps_the_base(online_transfer, v100_2019):
    """A3C shares no neighbour with the other families (module doc of the correction):
    every other pair observed, its rows still read exactly the base model's MAPE."""
    readings = online_transfer.held_out(v100_2019, ContentionPredictor(), NOISY, seed=0)
    a3c = readings["A3C"]
    assert a3c.rows > 0 and a3c.corrected == pytest.approx(a3c.base)
    moved = [r for r in readings.values() if not np.isclose(r.corrected, r.base)]
    assert moved and all(r.corrected < r.base for r in moved)


def test_main_prints_the_curve_and_the_held_out_table(online_transfer, capsys):
    assert online_transfer.main(["--gpu", "v100", "--seeds", "0", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "328 measured pairs" in out
    for heading in ("## shipped ONNX", "## heuristic", "one family held out"):
        assert heading in out
    assert "nan" not in out


def test_renamed_models_stay_as_many_families_as_named_ones(online_transfer, tmp_path, capsys):
    """``--rename-families`` plays a user's own models, which the loader has no parameter
    count for: the correction's family keys are as many as with the known names (before,
    every renamed family was one key), and the learning curve reads alike."""
    source = shipped_csv("gavel_colocation_pairs_2019.csv")
    named = load_pairs(source)
    copy = load_pairs(online_transfer.renamed(source, tmp_path))
    assert set(copy.victim_family.tolist()) == {f"user-{f}" for f in named.victim_family}
    assert len(set(pair_keys(copy.x)[1].tolist())) == len(set(pair_keys(named.x)[1].tolist()))
    args = ["--gpu", "v100", "--seeds", "0", "--steps", "100", "--rename-families"]
    assert online_transfer.main(args) == 0
    assert "models renamed, 328 measured pairs" in capsys.readouterr().out


def test_renaming_reads_the_file_as_the_loader_does(online_transfer, tmp_path):
    """A pair CSV saved with a byte-order mark loads; its renamed copy must too."""
    source = tmp_path / "bom.csv"
    source.write_bytes(
        b"\xef\xbb\xbf" + shipped_csv("gavel_colocation_pairs_2019.csv").read_bytes()
    )
    folder = tmp_path / "copy"
    folder.mkdir()
    copy = load_pairs(online_transfer.renamed(source, folder))
    assert len(copy) == len(load_pairs(source))


def test_lucids_two_tables_are_one_cluster_and_rename_as_one(
    online_transfer, lucid_tables, tmp_path, capsys
):
    """``--pairs`` twice: Lucid's co-location and solo tables; renamed, the solo rows
    still fill the renamed pair rows' counters (both files' model columns renamed)."""
    pair_file, solo_file = lucid_tables
    args = ["--pairs", str(pair_file), "--pairs", str(solo_file), "--seeds", "0", "--steps", "3"]
    assert online_transfer.main([*args, "--rename-families"]) == 0
    out = capsys.readouterr().out
    # 11 pairs of configurations: PointNet's self pairs at batches 32/64 and 64/32 are one
    assert "colocate_info.csv + single_data.csv, models renamed, 11 measured pairs" in out
    assert "| user-ResNet18 |" in out and "nan" not in out
    folder = tmp_path / "copies"
    copies = [folder / "0", folder / "1"]
    for copy in copies:
        copy.mkdir(parents=True)
    named = load_pairs([pair_file, solo_file])
    renamed = load_pairs(
        [online_transfer.renamed(p, c) for p, c in zip((pair_file, solo_file), copies, strict=True)]
    )
    assert set(renamed.victim_family.tolist()) == {f"user-{f}" for f in named.victim_family}
    np.testing.assert_array_equal(renamed.x[:, :6], named.x[:, :6])  # counters still filled
