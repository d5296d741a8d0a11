"""Lucid's published profile tables read by the pair loader as they are (issue 11: another
lab's measurements).  The tables here are written in Lucid's column layout with numbers
of our own (Lucid's data is under a non-commercial licence and does not ship)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elastico_extender.core.interference.features import FEATURE_NAMES, PARAMS
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import load_pairs
from elastico_extender.interference.lucid_tables import LUCID_GPU, table_kind

# Lucid's co-location header: a blank pandas index column first, the pair's counters last.
PAIRS_HEADER = (
    ",model1,dataset1,gpu_num1,batchsize1,amp1,speed1,"
    "model2,dataset2,gpu_num2,batchsize2,amp2,speed2,gpu_util,gmem_util,gmem\n"
)
PAIRS = (
    "0,ResNet18,CIFAR-10,1,64,0,0.8,VGG,CIFAR-10,1,32,1,0.5,90.0,40.0,7000\n"
    "1,VGG,CIFAR-10,1,32,1,1.02,VGG,CIFAR-10,1,32,1,0.98,70.0,30.0,6000\n"
)
SOLO_HEADER = "model,dataset,batchsize,amp,speed,gpu_util,gmem_util,gmem,label\n"
SOLO = (
    "ResNet18,CIFAR-10,64,0,3000.0,80.0,45.0,3072.0,2\n"
    "VGG,CIFAR-10,32,1,2500.0,40.0,20.0,2048.0,0\n"
)
COLUMN = {name: i for i, name in enumerate(FEATURE_NAMES)}


def _tables(tmp_path, pairs=PAIRS, solo=SOLO):
    pair_file, solo_file = tmp_path / "colocate_info.csv", tmp_path / "single_data.csv"
    pair_file.write_text(PAIRS_HEADER + pairs)
    solo_file.write_text(SOLO_HEADER + solo)
    return pair_file, solo_file


def _row(data, victim, partner):
    hits = np.flatnonzero((data.victim == victim) & (data.partner == partner))
    assert hits.size == 1, (victim, partner)
    return int(hits[0])


def test_the_header_tells_the_formats_apart():
    assert table_kind(PAIRS_HEADER.strip().split(",")) == "lucid-pairs"
    assert table_kind(SOLO_HEADER.strip().split(",")) == "lucid-solo"
    assert table_kind(["gpu", "job_a", "job_b", "solo_tput_a", "solo_tput_b"]) == "pairs"


@pytest.mark.parametrize("order", ["pairs first", "solo first"])
def test_each_pair_row_gives_both_slowdowns_and_the_jobs_own_counters(tmp_path, order):
    """speed is co-located over solo throughput, so the slowdown is its inverse; the solo
    table's counters fill the features the pair table lacks, whichever file comes first."""
    pair_file, solo_file = _tables(tmp_path)
    files = [pair_file, solo_file] if order == "pairs first" else [solo_file, pair_file]
    data = load_pairs(files)
    assert len(data) == 4 and set(data.gpu.tolist()) == {LUCID_GPU}
    resnet, vgg = "ResNet18 (CIFAR-10, batch 64)", "VGG (CIFAR-10, batch 32, amp)"
    i = _row(data, resnet, vgg)
    assert data.y[i] == pytest.approx(1 / 0.8) and data.y[i + 1] == pytest.approx(1 / 0.5)
    x = data.x[i]
    assert x[COLUMN["self_sm_active"]] == pytest.approx(0.80)
    assert x[COLUMN["self_sm_occupancy"]] == pytest.approx(0.80)
    assert x[COLUMN["self_dram_active"]] == pytest.approx(0.45)
    assert x[COLUMN["self_fb_used_gib"]] == pytest.approx(3.0)
    assert x[COLUMN["self_log10_throughput"]] == pytest.approx(math.log10(3000.0), rel=1e-6)
    assert x[COLUMN["self_micro_batch_log2"]] == 6 and x[COLUMN["self_amp"]] == 0
    assert x[COLUMN["partner_sm_active"]] == pytest.approx(0.40)
    assert x[COLUMN["partner_fb_used_gib"]] == pytest.approx(2.0)
    assert x[COLUMN["partner_amp"]] == 1
    # the tables name no GPU: memory pressure is of the 24 GiB RTX 3090 (module doc)
    assert x[COLUMN["memory_pressure"]] == pytest.approx(5.0 / 24.0, rel=1e-5)
    # a speed above 1 (a measurement's noise) is a slowdown below 1, kept as measured
    self_pair = np.flatnonzero((data.victim == vgg) & (data.partner == vgg))
    assert data.y[self_pair] == pytest.approx([1 / 1.02, 1 / 0.98])


def test_a_gpu_column_names_the_tables_gpu(tmp_path):
    pair_file = tmp_path / "pairs.csv"
    pair_file.write_text(
        PAIRS_HEADER.rstrip("\n") + ",gpu\n" + PAIRS.replace("\n", ",A100-SXM4-80GB\n")
    )
    data = load_pairs(pair_file)
    assert set(data.gpu.tolist()) == {"A100-SXM4-80GB"}
    assert data.x[0, COLUMN["memory_pressure"]] == 0.0  # no solo table: no footprint known


def test_without_the_solo_table_a_pair_keeps_the_loaders_fills(tmp_path):
    pair_file, _ = _tables(tmp_path)
    data = load_pairs(pair_file)
    assert len(data) == 4
    assert data.x[0, COLUMN["self_sm_active"]] == 0.5  # unknown GPU-bound share
    assert data.x[0, COLUMN["self_log10_throughput"]] == 0.0  # the table is relative
    assert data.y[_row(data, "ResNet18 (CIFAR-10, batch 64)", "VGG (CIFAR-10, batch 32, amp)")] == (
        pytest.approx(1.25)
    )


def test_spellings_of_one_model_share_its_parameter_count(tmp_path):
    """Lucid writes ResNet18 where Gavel writes ResNet-18: one family, one known size."""
    pair_file, solo_file = _tables(tmp_path)
    gavel = tmp_path / "gavel.csv"
    gavel.write_text(
        "gpu,job_a,job_b,model_a,model_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b\n"
        "v100,r,v,ResNet-18,VGG,10,10,1.2,1.3\n"
    )
    data = load_pairs([pair_file, solo_file, gavel])
    params = data.x[:, PARAMS]
    lucid_resnet = params[data.victim == "ResNet18 (CIFAR-10, batch 64)"]
    assert lucid_resnet.size and np.all(lucid_resnet == params[data.victim == "r"][0])
    assert params[data.victim == "r"][0] == pytest.approx(math.log10(11.2e6), rel=1e-6)


@pytest.mark.parametrize(
    ("cells", "column"),
    [
        ("0,ResNet18,CIFAR-10,1,64,0,0,VGG,CIFAR-10,1,32,1,0.5,1,1,1", "speed1"),
        ("0,ResNet18,CIFAR-10,1,64,0,0.8,VGG,CIFAR-10,1,32,1,fast,1,1,1", "speed2"),
        ("0,ResNet18,CIFAR-10,1,64,0,nan,VGG,CIFAR-10,1,32,1,0.5,1,1,1", "speed1"),
        ("0,ResNet18,CIFAR-10,1,64,2,0.8,VGG,CIFAR-10,1,32,1,0.5,1,1,1", "amp1"),
        ("0,ResNet18,CIFAR-10,1,6.5,0,0.8,VGG,CIFAR-10,1,32,1,0.5,1,1,1", "batchsize1"),
        ("0,,CIFAR-10,1,64,0,0.8,VGG,CIFAR-10,1,32,1,0.5,1,1,1", "model1"),
    ],
)
def test_a_bad_cell_of_a_co_location_table_is_named_in_lucids_columns(tmp_path, cells, column):
    pair_file, solo_file = _tables(tmp_path, pairs=PAIRS + cells + "\n")
    with pytest.raises(PredictorError, match=f"colocate_info.csv, line 4: column {column}"):
        load_pairs([pair_file, solo_file])


@pytest.mark.parametrize(
    ("cells", "column"),
    [
        ("VGG,CIFAR-10,32,1,-5,40.0,20.0,2048.0,0", "speed"),
        ("VGG,CIFAR-10,32,1,2500,140.0,20.0,2048.0,0", "gpu_util"),
        ("VGG,CIFAR-10,32,1,2500,40.0,-1,2048.0,0", "gmem_util"),
        ("VGG,CIFAR-10,32,1,2500,40.0,20.0,inf,0", "gmem"),
    ],
)
def test_a_bad_cell_of_a_solo_table_is_named(tmp_path, cells, column):
    pair_file, solo_file = _tables(tmp_path, solo=cells + "\n")
    with pytest.raises(PredictorError, match=f"single_data.csv, line 2: column {column}"):
        load_pairs([pair_file, solo_file])


def test_a_solo_table_alone_is_no_pair_data(tmp_path):
    _, solo_file = _tables(tmp_path)
    with pytest.raises(PredictorError, match="no measured pairs"):
        load_pairs(solo_file)


def test_a_short_row_of_a_co_location_table_names_its_line(tmp_path):
    pair_file, _ = _tables(tmp_path, pairs=PAIRS + "2,ResNet18,CIFAR-10\n")
    with pytest.raises(PredictorError, match="line 4: fewer cells"):
        load_pairs(pair_file)


def test_the_simulator_says_a_lucid_table_is_no_ground_truth(tmp_path):
    """``elastico simulate --interference colocate_info.csv``: the jobs are not the
    simulator's, and the error says where the table serves instead."""
    from elastico_extender.sim.truth import load_pair_table

    pair_file, _ = _tables(tmp_path)
    with pytest.raises(ValueError, match=r"one of Lucid's profile tables.*train-iac --csv"):
        load_pair_table(pair_file)
