"""Framework-native settings (spec 4.2): vLLM, PyTorch and MPS receive the budget."""

from __future__ import annotations

import re

import pytest

from elastico_extender.core.handoff import framework_settings, knob_problems, memory_share
from elastico_extender.core.model import Configuration, JobKind


def test_vllm_memory_utilization_is_budget_over_device_memory(families):
    fam = families["qwen-1.7b"]
    config = fam.configs[
        fam.index_of(
            {
                "max_num_seqs": 2,
                "max_model_len": 8192,
                "prefix_caching": True,
                "gpu_memory_utilization": 0.5,
            }
        )
    ]
    env = framework_settings(
        kind=JobKind.INFERENCE,
        configuration=config,
        memory_budget_mib=20480,
        device_memory_mib=40960,
        device_indices=(3,),
        sm_share=0.42,
        mps=False,
    )
    assert env["VLLM_GPU_MEMORY_UTILIZATION"] == "0.5000"
    args = env["ELASTICO_VLLM_ARGS"].split()
    assert "--gpu-memory-utilization=0.5000" in args
    assert "--max-num-seqs=2" in args and "--max-model-len=8192" in args
    assert "--enable-prefix-caching" in args
    assert env["NVIDIA_VISIBLE_DEVICES"] == "3"  # host GPU, exposed by the container runtime
    assert env["CUDA_VISIBLE_DEVICES"] == "0"  # renumbered inside the container
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env


# Measured on an H200 (PyTorch 2.11, CUDA 13, benchmarks/device_check.sh): under
# CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M a client saw 1777 MiB free once its context
# existed, while mem_get_info's total stayed the whole device's.
CONTEXT_MIB = 2048 - 1777


@pytest.mark.parametrize("budget", [2048, 20480, 40960])
@pytest.mark.parametrize("kind", [JobKind.INFERENCE, JobKind.TRAINING])
def test_under_mps_frameworks_fill_the_pinned_limit_less_the_context(families, budget, kind):
    """MPS's pinned limit holds the client's CUDA context too, and the device still
    reports its whole memory as total.  vLLM asks for utilization x total and refuses to
    start unless that much is free after its context exists; PyTorch's per-process
    fraction is of the total as well.  So under MPS both are told the budget less a
    context reserve, while the limit itself stays the budget."""
    device = 40960
    config = families["qwen-1.7b" if kind is JobKind.INFERENCE else "bert"].configs[0]
    env = framework_settings(
        kind=kind,
        configuration=config,
        memory_budget_mib=budget,
        device_memory_mib=device,
        device_indices=(0,),
        sm_share=0.5,
    )
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={budget}M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    free_after_context = budget - CONTEXT_MIB
    assert float(env["ELASTICO_MEMORY_FRACTION"]) * device <= free_after_context
    if kind is JobKind.INFERENCE:
        util = float(env["VLLM_GPU_MEMORY_UTILIZATION"])
        assert util * device <= free_after_context  # vLLM's start-up check passes
        assert f"--gpu-memory-utilization={util:.4f}" in env["ELASTICO_VLLM_ARGS"].split()
        assert env["ELASTICO_GPU_MEMORY_UTILIZATION"] == env["VLLM_GPU_MEMORY_UTILIZATION"]
        assert util * device >= budget - 1024  # and the rest of the budget is used


def test_pytorch_allocator_cap_and_fraction(families):
    fam = families["bert"]
    config = fam.configs[0]
    env = framework_settings(
        kind=JobKind.TRAINING,
        configuration=config,
        memory_budget_mib=24576,
        device_memory_mib=40960,
        device_indices=(0, 1),
        mps=False,
    )
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:24576"
    assert env["ELASTICO_MEMORY_FRACTION"] == "0.6000"
    assert env["ELASTICO_BATCH_SIZE"] == str(config["batch_size"])
    assert env["ELASTICO_CHECKPOINTING"] in {"0", "1"}
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "0,1"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


@pytest.mark.parametrize("budget", [0, -5, 50000, float("nan")])
def test_impossible_budget_is_refused(families, budget):
    with pytest.raises(ValueError, match="memory budget"):
        framework_settings(
            kind=JobKind.TRAINING,
            configuration=families["bert"].configs[0],
            memory_budget_mib=budget,
            device_memory_mib=40960,
            device_indices=(0,),
        )


def test_every_catalog_configuration_passes_the_knob_check(families) -> None:
    """The check refuses what bind never writes: not one configuration of the catalog."""
    refused = {
        (name, config.label): knob_problems(config.as_dict())
        for name, fam in families.items()
        for config in fam.configs
        if knob_problems(config.as_dict())
    }
    assert refused == {}
    assert len(families) == 12 and sum(fam.size for fam in families.values()) == 768


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"memory_budget_mib": 99_999}, "ElastiCo's own ELASTICO_MEMORY_BUDGET_MIB"),
        ({"Sm_Share": 1.0}, "ElastiCo's own ELASTICO_SM_SHARE"),
        ({"a b": 1}, "not a name"),
        ({"x" * 65: 1}, "not a name"),
        ({"amp": True, "AMP": False}, "only in case"),
        ({"batch_size": 0}, "batch_size must be a positive integer"),
        ({"batch_size": True}, "batch_size must be a positive integer"),
        ({"prefix_caching": "off"}, "prefix_caching must be true or false"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization must be a number in (0, 1]"),
        # read by the shim and elastico-run, not written by framework_settings: a knob
        # shim_disable would have switched profiling (and so the loop's eyes) off
        ({"shim_disable": True}, "ElastiCo's own ELASTICO_SHIM_DISABLE"),
        ({"shim_dir": "/tmp"}, "ElastiCo's own ELASTICO_SHIM_DIR"),
        ({"annotations_file": "/x"}, "ElastiCo's own ELASTICO_ANNOTATIONS_FILE"),
        # '-' and '.' become '_' in the variable: these are ElastiCo's own names too ...
        ({"memory-budget-mib": 99_999}, "ElastiCo's own ELASTICO_MEMORY_BUDGET_MIB"),
        ({"shim.disable": True}, "ElastiCo's own ELASTICO_SHIM_DISABLE"),
        # ... and two knobs that map alike would set one variable twice
        ({"grad-accum": 4, "grad_accum": 2},
         "knob names 'grad-accum' and 'grad_accum' both become ELASTICO_GRAD_ACCUM"),
        ({"lr.warmup": 10, "LR-WARMUP": 5}, "both become ELASTICO_LR_WARMUP"),
    ],
    ids=["budget", "sm-share-any-case", "space", "too-long", "case-twin", "zero-batch",
         "bool-batch", "word-switch", "zero-cap", "shim-off", "shim-dir", "annotations",
         "budget-dashed", "shim-dotted", "dash-twin", "dot-dash-twin"],
)  # fmt: skip
def test_a_bad_knob_never_reaches_a_pod(knobs: dict, named: str) -> None:
    assert any(named in problem for problem in knob_problems(knobs))
    with pytest.raises(ValueError, match=re.escape(named)):
        framework_settings(
            kind=JobKind.TRAINING,
            configuration=Configuration.from_dict(knobs),
            memory_budget_mib=1024,
            device_memory_mib=40960,
            device_indices=(0,),
        )


def test_an_unknown_knob_with_a_plain_name_passes_as_its_own_variable() -> None:
    env = framework_settings(
        kind=JobKind.TRAINING,
        configuration=Configuration.from_dict({"grad_accum": 4}),
        memory_budget_mib=1024,
        device_memory_mib=40960,
        device_indices=(0,),
    )
    assert env["ELASTICO_GRAD_ACCUM"] == "4"


def test_knob_names_with_dash_or_dot_become_variables_a_shell_can_name() -> None:
    """An unprofiled workload's one configuration is ``as-is=on``: refusing its ``-``
    failed the bind of every unprofiled pod, so ``-`` and ``.`` pass the check.  But the
    variable was ``ELASTICO_AS-IS``, which no POSIX shell can read (``$ELASTICO_AS-IS``
    is ``$ELASTICO_AS`` and ``-IS``) and dash drops: each becomes ``_``."""
    from elastico_extender.service.families import UNPROFILED

    assert knob_problems(UNPROFILED.as_dict()) == []
    knobs = {"lr.warmup": 10, "grad-accum": 4, "as-is": True}
    assert knob_problems(knobs) == []
    env = framework_settings(
        kind=JobKind.TRAINING,
        configuration=Configuration.from_dict(knobs),
        memory_budget_mib=1024,
        device_memory_mib=40960,
        device_indices=(0,),
    )
    assert (env["ELASTICO_AS_IS"], env["ELASTICO_LR_WARMUP"], env["ELASTICO_GRAD_ACCUM"]) == (
        "1",
        "10",
        "4",
    )
    shell_name = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
    assert [name for name in env if not shell_name.fullmatch(name)] == []


@pytest.mark.parametrize("device", [0.5, 0.0, -1.0], ids=["half-mib", "zero", "negative"])
def test_a_device_under_one_mib_is_a_value_error_not_a_division_by_zero(device: float) -> None:
    """Whole MiB: a device of 0.5 MiB rounded to 0 and was divided by."""
    with pytest.raises(ValueError, match="MiB"):
        memory_share(0.25, device)
