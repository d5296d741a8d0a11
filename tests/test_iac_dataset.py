"""The pair-CSV loader against the real Gavel table: feature order and block swap."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from elastico_extender.core.interference.features import (
    FEATURE_NAMES,
    UNKNOWN_PARAMS_SPREAD,
    unknown_family_log10_params,
)
from elastico_extender.core.interference.online import pair_keys
from elastico_extender.errors import PredictorError
from elastico_extender.interference.dataset import gpu_bound_share, load_pairs, shipped_csv


@pytest.fixture(scope="module")
def data():
    return load_pairs(shipped_csv())


def _measured_rows():
    with shipped_csv().open() as handle:
        return [r for r in csv.DictReader(handle) if r["measured"] == "1"]


def test_two_rows_per_measured_pair(data):
    rows = _measured_rows()
    assert len(data) == 2 * len(rows) == 1952
    assert data.x.shape == (1952, 36) and data.x.dtype == np.float32


def test_blocks_are_swapped_between_the_two_rows_of_a_pair(data):
    first, second = data.x[0::2], data.x[1::2]
    np.testing.assert_array_equal(first[:, :14], second[:, 14:28])
    np.testing.assert_array_equal(first[:, 14:28], second[:, :14])
    np.testing.assert_array_equal(first[:, 28:], second[:, 28:])  # pairwise terms are symmetric
    assert (data.pair_id[0::2] == data.pair_id[1::2]).all()


def test_labels_and_throughput_follow_the_victim(data):
    row = next(r for r in _measured_rows() if r["job_a"] != r["job_b"] and r["gpu"] == "v100")
    i = int(
        np.flatnonzero(
            (data.victim == row["job_a"]) & (data.partner == row["job_b"]) & (data.gpu == "v100")
        )[0]
    )
    assert data.y[i] == pytest.approx(float(row["slowdown_a"]))
    assert data.y[i + 1] == pytest.approx(float(row["slowdown_b"]))
    names = list(FEATURE_NAMES)
    assert data.x[i, names.index("self_log10_throughput")] == pytest.approx(
        np.log10(float(row["solo_tput_a"])), rel=1e-5
    )
    assert data.x[i, names.index("partner_log10_throughput")] == pytest.approx(
        np.log10(float(row["solo_tput_b"])), rel=1e-5
    )
    if row["batch_size_a"]:
        assert data.x[i, names.index("self_micro_batch_log2")] == pytest.approx(
            np.log2(float(row["batch_size_a"]))
        )


def test_gavel_rows_are_training_pairs_with_slowdowns_at_least_one(data):
    assert set(data.colocation_type) == {0}
    assert (data.x[:, 5] == 0).all() and (data.y >= 1.0 - 1e-6).all()
    assert len(set(data.victim_family)) == 7


def test_gpu_bound_share_follows_cross_gpu_scaling():
    # scales exactly like the peaks: fully GPU-bound everywhere
    assert gpu_bound_share({"k80": 1.0, "v100": 15.7 / 4.37}, "v100") == pytest.approx(1.0)
    # no speed-up on a faster GPU: host-bound
    assert gpu_bound_share({"k80": 2.0, "v100": 2.0}, "k80") == pytest.approx(0.0)
    # partial scaling: the GPU share is larger on the slower GPU
    solo = {"k80": 1.0, "p100": 1.5, "v100": 2.0}
    assert 0 < gpu_bound_share(solo, "v100") < gpu_bound_share(solo, "k80") < 1
    assert gpu_bound_share({"v100": 3.0}, "v100") == 0.5  # one GPU type only: unknown


def test_explicit_feature_columns_override_the_fills(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,colo_tput_a,colo_tput_b,sm_active_a,is_inference_b\n"
        "a100,x,y,10,20,5,10,0.9,1\n"
    )
    d = load_pairs(path)
    assert d.y.tolist() == [2.0, 2.0]
    assert d.x[0, 0] == pytest.approx(0.9) and d.x[1, 14] == pytest.approx(0.9)
    assert d.colocation_type.tolist() == [1, 1]
    assert d.x[0, 33] == 0.0 and d.x[0, 7] == pytest.approx(1.0)


def test_families_the_loader_does_not_know_stay_apart_in_the_correction(tmp_path):
    """A user's pair table names its own models (no parameter counts).  Before, every such
    family got log10_params 7 exactly, so the online correction's family key took them for
    one family, pooling their residuals.  Now each keeps a value of its own, near 7;
    a known family and a given log10_params are as before."""
    path = tmp_path / "pairs.csv"
    path.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b,model_a,model_b,"
        "log10_params_b\n"
        "v100,m1,m2,10,20,1.5,1.5,vgg16,gpt2,\n"
        "v100,m3,m4,10,20,1.5,1.5,lab-bert,ResNet-50,\n"
        "v100,m5,m6,10,20,1.5,1.5,vgg16,lab-bert,8.5\n"
    )
    d = load_pairs(path)
    vgg, gpt2, lab_bert, resnet = d.x[0, 6], d.x[0, 20], d.x[2, 6], d.x[2, 20]
    assert len({float(vgg), float(gpt2), float(lab_bert)}) == 3
    assert all(abs(v - 7.0) <= UNKNOWN_PARAMS_SPREAD + 1e-6 for v in (vgg, gpt2, lab_bert))
    assert resnet == pytest.approx(np.log10(25.6e6))
    assert d.x[4, 6] == vgg and d.x[4, 20] == pytest.approx(8.5)  # the same name, the given
    families = pair_keys(d.x[[0, 2]])[1]
    assert families[0] != families[1]


@pytest.mark.parametrize(
    ("gpu", "memory"),
    [
        ("A100-SXM4-80GB", 80.0),  # before: a100, 40
        ("NVIDIA A100 80GB PCIe", 80.0),  # before: unknown, 16
        ("a100-40gb", 40.0),
        ("GeForce RTX 3090", 24.0),  # before: unknown, 16
        ("V100-SXM2-32GB", 32.0),  # before: v100, 16
        ("NVIDIA L40S", 48.0),
        ("mi250x", 16.0),  # a model the tables lack: the default
    ],
)
def test_another_labs_gpu_names_give_their_device_memory(tmp_path, gpu, memory):
    """Memory pressure (column 33) divides both jobs' memory by the device's: a lab's own
    spelling of its GPU must not halve or double it."""
    path = tmp_path / "pairs.csv"
    path.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b,fb_used_gib_a,"
        f"fb_used_gib_b\n{gpu},x,y,10,20,1.5,1.5,6,2\n"
    )
    assert load_pairs(path).x[0, 33] == pytest.approx(8.0 / memory)


def test_a_job_measured_on_two_gpu_models_of_another_lab_gets_its_gpu_bound_share(tmp_path):
    """The GPU-bound share needs two known peaks: a job 2.5 times faster on an RTX 3090
    than on an RTX 2080 Ti (peaks 35.6 and 13.4 TFLOP/s) is mostly GPU-bound."""
    path = tmp_path / "pairs.csv"
    path.write_text(
        "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b\n"
        "GeForce RTX 2080 Ti,x,y,10,20,1.5,1.5\n"
        "GeForce RTX 3090,x,y,25,20,1.5,1.5\n"
    )
    d = load_pairs(path)
    share_2080, share_3090 = d.x[0, 0], d.x[2, 0]
    assert share_2080 > share_3090 > 0.5  # before: 0.5 (unknown) on both
    assert d.x[1, 14] == share_2080  # the swapped row: x is the partner


def test_an_unknown_familys_params_are_fixed_by_its_name():
    first = unknown_family_log10_params("team-a-trainer", 7.0)
    assert first == unknown_family_log10_params("team-a-trainer", 7.0)  # no per-process salt
    assert abs(first - 7.0) <= UNKNOWN_PARAMS_SPREAD
    nudges = {unknown_family_log10_params(f"w{i}", 7.0) for i in range(1000)}
    reach = 0.8 * UNKNOWN_PARAMS_SPREAD  # the nudges spread over most of the range
    assert len(nudges) == 1000 and min(nudges) < 7.0 - reach and max(nudges) > 7.0 + reach


def test_csv_without_required_columns_is_rejected(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("gpu,job_a\nk80,x\n")
    with pytest.raises(PredictorError, match="lacks columns"):
        load_pairs(path)


HEADER = (
    "gpu,job_a,job_b,solo_tput_a,solo_tput_b,colo_tput_a,colo_tput_b,batch_size_a,sm_active_a\n"
)


@pytest.mark.parametrize(
    ("cells", "column"),
    [
        ("a100,x,y,10,20,5,10,inf,0.9", "batch_size_a"),  # log2(inf) would be a feature
        ("a100,x,y,10,20,5,10,32,nan", "sm_active_a"),
        ("a100,x,y,10,20,5,10,32,-inf", "sm_active_a"),
        ("a100,x,y,10,20,5,oops,32,0.5", "colo_tput_b"),
        ("a100,x,y,10,20,0,10,32,0.5", "colo_tput_a"),
    ],
)
def test_a_bad_cell_of_a_users_pair_csv_is_named(tmp_path, cells, column):
    """train-iac --csv with a user's own measurements: a non-finite or unparseable
    cell is an error naming its line and column, never a NaN the network trains on."""
    path = tmp_path / "pairs.csv"
    path.write_text(HEADER + "a100,x,y,10,20,5,10,32,0.5\n" + cells + "\n")
    with pytest.raises(PredictorError, match=f"line 3: column {column}"):
        load_pairs(path)


@pytest.mark.parametrize("solo", ["nan", "inf", "0", "x", "-1"])
def test_a_bad_solo_throughput_is_named(tmp_path, solo):
    path = tmp_path / "pairs.csv"
    path.write_text(HEADER + f"a100,x,y,{solo},20,5,10,32,0.5\n")
    with pytest.raises(PredictorError, match="line 2: column solo_tput_a"):
        load_pairs(path)


def test_a_short_row_is_an_error_naming_its_line(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text(HEADER + "a100,x,y,10,20,5,10,32,0.5\nv100\n")
    with pytest.raises(PredictorError, match="line 3"):
        load_pairs(path)


GAVEL_HEADER = "gpu,job_a,job_b,slowdown_a,slowdown_b,solo_tput_a,solo_tput_b,measured\n"


@pytest.mark.parametrize(
    ("measured", "kept"),
    [("1", True), ("1.0", True), ("true", True), ("", True), ("0", False), ("0.00", False),
     ("false", False), ("FALSE", False)],
)  # fmt: skip
def test_both_pair_readers_agree_which_rows_are_measured(tmp_path, measured, kept):
    """The simulator's truth and the IAC trainer read one Gavel file: one rule decides
    which of its rows are measurements (they disagreed on '0.00' and 'false')."""
    from elastico_extender.sim.truth import load_pair_table

    path = tmp_path / "pairs.csv"
    measured_row = "v100,A3C,A3C,1.5,1.5,10,10,1\n"
    path.write_text(GAVEL_HEADER + measured_row + f"v100,A3C,CycleGAN,1.2,1.3,10,20,{measured}\n")
    assert (("A3C", "CycleGAN") in load_pair_table(path, gpu="v100")) == kept
    assert len(load_pairs(path)) == (4 if kept else 2)


@pytest.mark.parametrize("measured", ["maybe", "2", "nan"])
def test_a_measured_flag_that_is_neither_is_named_by_both_readers(tmp_path, measured):
    from elastico_extender.sim.truth import load_pair_table

    path = tmp_path / "pairs.csv"
    path.write_text(GAVEL_HEADER + f"v100,A3C,CycleGAN,1.2,1.3,10,20,{measured}\n")
    with pytest.raises(ValueError, match="line 2: column measured"):
        load_pair_table(path, gpu="v100")
    with pytest.raises(PredictorError, match="line 2: column measured"):
        load_pairs(path)


def test_a_cell_over_the_csv_field_limit_is_an_error_naming_its_line(tmp_path):
    """A cell longer than the csv module's field limit (the wrong file, a minified JSON
    passed as --csv) raised csv.Error out of train-iac as a traceback."""
    path = tmp_path / "pairs.csv"
    path.write_text(HEADER + "a100,x,y,10,20,5,10,32,0.5\n" + '"' + "x" * 200_000 + '"\n')
    with pytest.raises(PredictorError, match=f"{path}, after line 2: field larger"):
        load_pairs(path)
