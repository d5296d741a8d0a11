"""Framework-native settings for a decision (spec 4.2): no user code changes.

Pure translation of "job j runs configuration c on GPU g with a memory budget
of M_j MiB" into the environment variables and launcher arguments that the
frameworks already understand.  The extender writes these into the pod's
ConfigMap at bind time; ``elastico-run`` reads them inside the container.

==================  ==========================================================
framework           setting
==================  ==========================================================
vLLM                ``--gpu-memory-utilization M_j / M_GPU`` (+ the chosen
                    ``--max-num-seqs``, ``--max-model-len``,
                    ``--enable-prefix-caching``)
PyTorch             ``PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:M_j`` and
                    ``ELASTICO_MEMORY_FRACTION`` = M_j / M_GPU, applied by the
                    launcher through ``torch.cuda.set_per_process_memory_fraction``
MPS                 ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<M_j>M`` and
                    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the SM share; the
                    vLLM and PyTorch fractions above are then of M_j less
                    ``MPS_CONTEXT_RESERVE_MIB`` (:func:`framework_share`)
all                 ``NVIDIA_VISIBLE_DEVICES`` = host GPU index (the container
                    runtime exposes it), ``CUDA_VISIBLE_DEVICES`` = 0..n-1 inside;
                    ``ELASTICO_*`` knobs for training scripts that read them, and the
                    fields ``elastico-run`` falls back to (launcher.assignment)
==================  ==========================================================
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from elastico_extender.core.model import Configuration, JobKind, KnobValue

__all__ = [
    "ENV_PREFIX",
    "MIN_DEVICE_MIB",
    "MPS_CONTEXT_RESERVE_MIB",
    "MemoryShare",
    "framework_settings",
    "framework_share",
    "knob_problems",
    "knob_variable",
    "memory_share",
    "vllm_arguments",
]

ENV_PREFIX = "ELASTICO_"

OWN_SETTINGS = frozenset({
    # written by framework_settings itself
    "GPU_INDICES", "WORKLOAD_KIND", "CONFIGURATION", "CONFIGURATION_JSON",
    "MEMORY_BUDGET_MIB", "DEVICE_MEMORY_MIB", "MEMORY_FRACTION", "SM_SHARE", "MPS",
    "VLLM_ARGS",
    # read by elastico-run, the runtime bundle and the node agent
    "ANNOTATIONS_FILE", "USER_SETTINGS", "PROFILING", "GRACE_SECONDS", "POLL_SECONDS",
    "PYTHON", "POD_UID", "CONTAINER_NAME", "RING_ROOT", "DCGM_URL",
})  # fmt: skip
"""The ``ELASTICO_*`` variables ElastiCo sets or reads itself, and every ``SHIM_*`` one
(the profiler shim's): no knob may be named as one.  A knob ``memory_budget_mib``
would have replaced the budget, ``shim_disable`` switched the loop's eyes off."""

KNOB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
"""A knob's name: letters, digits, ``_``, ``-`` and ``.``.  An unprofiled workload's one
configuration is ``as-is`` (``service.families.UNPROFILED``), and profiling tools name
knobs ``lr.warmup`` or ``grad-accum``; its variable is :func:`knob_variable`'s."""
_NOT_IN_A_VARIABLE = str.maketrans("-.", "__")


def knob_variable(name: str) -> str:
    """The environment variable a knob reaches the workload as: ``ELASTICO_`` and the name
    upper-cased with ``-`` and ``.`` as ``_`` (``as-is`` is ``ELASTICO_AS_IS``).

    Kubernetes takes ``-`` and ``.`` in a variable's name, but a POSIX shell cannot:
    ``$ELASTICO_AS-IS`` reads ``$ELASTICO_AS`` then ``-IS``, and dash and busybox sh drop
    such variables from the environment they pass on, so a launch script never saw the
    knob.  The mapping is many-to-one (``grad-accum``, ``grad_accum``, ``GRAD.ACCUM``),
    so :func:`knob_problems` refuses two knobs of one configuration that map alike."""
    return ENV_PREFIX + name.upper().translate(_NOT_IN_A_VARIABLE)


def _positive_int(value: KnobValue) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _switch(value: KnobValue) -> bool:
    return isinstance(value, bool)


def _fraction(value: KnobValue) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 1


KNOB_KINDS: Mapping[str, tuple[Callable[[KnobValue], bool], str]] = {
    "batch_size": (_positive_int, "a positive integer"),
    "max_num_seqs": (_positive_int, "a positive integer"),
    "max_model_len": (_positive_int, "a positive integer"),
    "checkpointing": (_switch, "true or false"),
    "amp": (_switch, "true or false"),
    "prefix_caching": (_switch, "true or false"),
    "gpu_memory_utilization": (_fraction, "a number in (0, 1]"),
}
"""What each knob the catalogs define (``core.shapes.knobs``) may hold: the value a
framework flag or a training script gets verbatim."""


def knob_problems(knobs: Mapping[str, KnobValue]) -> list[str]:
    """What is wrong with knobs a pod was assigned (empty when nothing): names that no
    environment variable can hold or that name a variable ElastiCo owns, and
    known knobs of the wrong kind (``batch_size: -8`` would reach the workload as is,
    ``prefix_caching: "off"`` would turn caching on)."""
    problems = []
    seen: dict[str, str] = {}  # variable -> the knob that takes it
    for name, value in knobs.items():
        shown = repr(name[:40])
        variable = knob_variable(name)
        own = variable.removeprefix(ENV_PREFIX)
        if not KNOB_NAME.fullmatch(name):
            problems.append(f"knob name {shown} is not a name of letters, digits, _, - and .")
        elif own in OWN_SETTINGS or own.startswith("SHIM_"):
            problems.append(f"knob name {shown} is ElastiCo's own {variable}")
        elif variable in seen:
            problems.append(
                f"knob names {seen[variable][:40]!r} and {shown} both become {variable} "
                "(names may not differ only in case or in '-', '.' and '_')"
            )
        else:
            seen[variable] = name
        check = KNOB_KINDS.get(name)
        if check is not None and not check[0](value):
            problems.append(f"knob {name} must be {check[1]}, got {json.dumps(value)[:40]}")
    return problems


@dataclass(frozen=True)
class MemoryShare:
    """A job's memory budget M_j on a device of M_GPU MiB, as every consumer writes it.

    Computed once per decision (:func:`memory_share`) and only formatted afterwards,
    so the pod annotation, the ConfigMap, the vLLM flag and the knob environment can
    never disagree by a rounding: whole MiB rounded down, and the fraction rounded
    down to 4 decimals, so no setting hands the workload more than M_j."""

    budget_mib: int
    device_mib: int
    fraction: str  # budget_mib / device_mib, 4 decimals, rounded down

    @property
    def value(self) -> float:
        return float(self.fraction)


MIN_DEVICE_MIB = 1.0
"""The smallest device memory a decision may name: shares are in whole MiB, so a device
of 0.5 MiB would be one of 0, and divided by."""


def memory_share(memory_budget_mib: float, device_memory_mib: float) -> MemoryShare:
    """The one rounding of (M_j, M_GPU); ValueError unless 0 < M_j <= M_GPU, 1 <= M_GPU."""
    if not (math.isfinite(device_memory_mib) and device_memory_mib >= MIN_DEVICE_MIB):
        raise ValueError(f"device memory {device_memory_mib} MiB must be at least 1 MiB")
    if not (math.isfinite(memory_budget_mib) and 0 < memory_budget_mib <= device_memory_mib):
        raise ValueError(
            f"memory budget {memory_budget_mib} MiB must be in (0, {device_memory_mib}] MiB"
        )
    device = int(device_memory_mib)
    budget = max(1, min(int(memory_budget_mib), device))
    fraction = math.floor(budget * 10_000 / device) / 10_000
    return MemoryShare(budget, device, f"{fraction:.4f}")


MPS_CONTEXT_RESERVE_MIB = 512
"""What an MPS client's CUDA context takes out of its pinned memory limit, with room to
spare: 271 MiB measured for PyTorch 2.11 on CUDA 13 on an H200 before any tensor
(benchmarks/device_check.sh); lazily loaded modules and library handles add to it."""


def framework_share(memory_budget_mib: float, device_memory_mib: float, mps: bool) -> MemoryShare:
    """The share of the device a framework is told to fill (vLLM's utilization, PyTorch's
    per-process fraction).

    Both are fractions of the memory the device reports, which MPS leaves at the whole
    device.  Without MPS that is the budget's own share.  Under MPS the pinned limit of
    M_j also holds the process's CUDA context, and vLLM refuses to start unless
    utilization x total is free once its context exists, so the share is of M_j less
    :data:`MPS_CONTEXT_RESERVE_MIB` (at least 1 MiB: a budget that small cannot run)."""
    share = memory_share(memory_budget_mib, device_memory_mib)
    if not mps:
        return share
    return memory_share(max(1, share.budget_mib - MPS_CONTEXT_RESERVE_MIB), share.device_mib)


def vllm_arguments(configuration: Configuration, memory_fraction: float) -> list[str]:
    """vLLM engine flags for an inference configuration and its memory share."""
    args = [f"--gpu-memory-utilization={memory_fraction:.4f}"]
    seqs = configuration.get("max_num_seqs")
    if seqs is not None:
        args.append(f"--max-num-seqs={seqs}")
    length = configuration.get("max_model_len")
    if length is not None:
        args.append(f"--max-model-len={length}")
    if configuration.get("prefix_caching"):
        args.append("--enable-prefix-caching")
    elif configuration.get("prefix_caching") is not None:
        args.append("--no-enable-prefix-caching")
    return args


def framework_settings(
    *,
    kind: JobKind,
    configuration: Configuration,
    memory_budget_mib: float,
    device_memory_mib: float,
    device_indices: tuple[int, ...],
    sm_share: float = 1.0,
    mps: bool = True,
) -> dict[str, str]:
    """Environment for the workload container; every value is a string.

    Raises ValueError on a budget that is not a positive number no larger than
    the device, or on knobs :func:`knob_problems` refuses, so a bad decision never
    reaches a pod.
    """
    share = memory_share(memory_budget_mib, device_memory_mib)
    usable = framework_share(memory_budget_mib, device_memory_mib, mps)
    if not device_indices:
        raise ValueError("at least one device index is required")
    problems = knob_problems(configuration.as_dict())
    if problems:
        raise ValueError("; ".join(problems))
    budget = share.budget_mib
    host = ",".join(str(i) for i in device_indices)
    env = {
        # The NVIDIA container runtime exposes these host GPUs; inside, CUDA numbers them 0..n-1.
        "NVIDIA_VISIBLE_DEVICES": host,
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(len(device_indices))),
        knob_variable("GPU_INDICES"): host,
        knob_variable("WORKLOAD_KIND"): kind.value,
        knob_variable("CONFIGURATION"): configuration.label,
        knob_variable("CONFIGURATION_JSON"): json.dumps(configuration.as_dict()),
        knob_variable("MEMORY_BUDGET_MIB"): str(budget),
        knob_variable("DEVICE_MEMORY_MIB"): str(share.device_mib),
        knob_variable("MEMORY_FRACTION"): usable.fraction,
        knob_variable("SM_SHARE"): f"{sm_share:.4f}",
        knob_variable("MPS"): "true" if mps else "false",
    }
    for name, value in configuration.knobs:
        shown = ("1" if value else "0") if isinstance(value, bool) else str(value)
        env[knob_variable(name)] = shown
    if kind is JobKind.INFERENCE:
        # The profile's MU knob is relative to the device it was profiled on (an A100
        # 40 GB for the catalog); on any other device the share vLLM really gets is the
        # budget's, so the knob variable says that one value too.
        env[knob_variable("GPU_MEMORY_UTILIZATION")] = usable.fraction
        env[knob_variable("VLLM_ARGS")] = " ".join(vllm_arguments(configuration, usable.value))
        env["VLLM_GPU_MEMORY_UTILIZATION"] = usable.fraction
    else:
        env["PYTORCH_CUDA_ALLOC_CONF"] = f"max_split_size_mb:{budget}"
    if mps:
        # Inside the container the device is renumbered from 0 by CUDA_VISIBLE_DEVICES.
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={budget}M" for i in range(len(device_indices))
        )
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(100, round(sm_share * 100))))
    return env
