"""RST catalog and knob spaces against the spec's table 'Workloads used in evaluation'."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.model import JobKind
from elastico_extender.core.shapes.catalog import CATALOG, build_family, knob_space
from elastico_extender.core.shapes.knobs import KnobSpace, memory_utilization_steps
from elastico_extender.errors import UnknownWorkloadError

# (workload, kind, spec memory range GB, configurations in the Cartesian product)
SPEC_TABLE = [
    ("resnet50", JobKind.TRAINING, (12, 24), 20),
    ("bert", JobKind.TRAINING, (24, 36), 12),
    ("dcgan", JobKind.TRAINING, (8, 16), 20),
    ("pointnet", JobKind.TRAINING, (12, 20), 20),
    ("transformer", JobKind.TRAINING, (20, 38), 20),
    ("lstm", JobKind.TRAINING, (4, 12), 32),
    ("ncf", JobKind.TRAINING, (4, 16), 36),
    ("ppo", JobKind.TRAINING, (8, 24), 32),
    ("deepseek-1.5b", JobKind.INFERENCE, (16, 36), 198),
    ("qwen-1.7b", JobKind.INFERENCE, (16, 36), 198),
    ("mistral-7b", JobKind.INFERENCE, (28, 36), 90),
    ("llama3-7b", JobKind.INFERENCE, (28, 36), 90),
]


def test_catalog_has_the_twelve_spec_workloads():
    assert sorted(CATALOG) == sorted(row[0] for row in SPEC_TABLE)


@pytest.mark.parametrize(("name", "kind", "mem", "count"), SPEC_TABLE)
def test_family_matches_spec_table(families, name, kind, mem, count):
    family = families[name]
    assert family.kind is kind
    assert family.size == count
    gib = family.resources[:, 1] / 1024
    assert gib.max() == pytest.approx(mem[1], abs=0.05)  # peak matches exactly
    assert mem[0] - 2.0 <= gib.min() <= mem[0] + 0.05  # within 2 GB of the table's floor
    assert np.all(family.throughput > 0)
    assert np.all((family.resources[:, 0] > 0) & (family.resources[:, 0] <= 1))


def test_peak_throughput_configuration_is_the_peak_memory_one(families):
    for name in ("resnet50", "bert"):
        family = families[name]
        assert family.fastest_index == int(np.argmax(family.resources[:, 1]))


def test_case1_anchors_checkpointing_bert_24gb_amp_resnet_14gb(families):
    bert = families["bert"]
    resnet = families["resnet50"]
    ck = bert.index_of({"batch_size": 128, "checkpointing": True, "amp": False})
    amp = resnet.index_of({"batch_size": 512, "checkpointing": False, "amp": True})
    assert bert.resources[ck, 1] / 1024 == pytest.approx(24.0, abs=0.05)
    assert resnet.resources[amp, 1] / 1024 == pytest.approx(14.0, abs=0.05)


def test_inference_memory_is_the_vllm_cap_times_device_memory(families):
    family = families["mistral-7b"]
    caps = np.array([c["gpu_memory_utilization"] for c in family.configs])
    assert np.allclose(family.resources[:, 1], caps * 40 * 1024)
    assert set(np.round(caps, 2)) == {0.7, 0.75, 0.8, 0.85, 0.9}


def test_memory_utilization_steps_are_0_05_apart():
    assert memory_utilization_steps(0.4, 0.9) == (
        0.4,
        0.45,
        0.5,
        0.55,
        0.6,
        0.65,
        0.7,
        0.75,
        0.8,
        0.85,
        0.9,
    )


def test_allowed_ranges_restrict_the_cartesian_product():
    space = knob_space(CATALOG["resnet50"])
    configs = space.configurations()
    rows = space.allowed_rows(configs, {"batch_size": (64, 128), "amp": frozenset({True})})
    chosen = [configs[r] for r in rows]
    assert len(chosen) == 2 * 2  # two batch sizes x checkpointing on/off, AMP forced on
    assert all(c["amp"] is True and 64 <= c["batch_size"] <= 128 for c in chosen)


def test_unknown_knob_in_ranges_is_reported_not_ignored():
    space = KnobSpace.of(batch_size=(32, 64))
    with pytest.raises(KeyError, match="microbatch"):
        space.allowed_rows(space.configurations(), {"microbatch": (1, 2)})


def test_unknown_workload_names_the_catalog():
    with pytest.raises(UnknownWorkloadError, match="resnet50"):
        build_family("resnet-51")
