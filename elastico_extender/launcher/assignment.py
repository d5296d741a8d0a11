"""The configuration ElastiCo assigned to this pod, and what it means for the workload.

Read from the downward-API annotations (written by the extender at bind time and
updated on reconfiguration) with environment variables as the fallback for anything
the annotations do not say.  Every problem is collected and raised together as one
:class:`~elastico_extender.errors.AnnotationError`.

The annotation names are the ones bind writes (``elastico_extender.annotations``,
``decision_annotations``); the environment fallbacks are the ones the ConfigMap
carries (``core.handoff.framework_settings``), injected by the webhook.

=================================== ================================ =====================
annotation                          environment fallback             meaning
=================================== ================================ =====================
``elastico.io/workload-kind``       ``ELASTICO_WORKLOAD_KIND``       training | inference
``elastico.io/assigned-knobs``      ``ELASTICO_CONFIGURATION_JSON``  JSON object of knobs
``elastico.io/memory-budget-mib``   ``ELASTICO_MEMORY_BUDGET_MIB``   M_j, MiB (> 0)
``elastico.io/device-memory-mib``   ``ELASTICO_DEVICE_MEMORY_MIB``   M_GPU, MiB (>= M_j)
``elastico.io/assigned-devices``    ``ELASTICO_GPU_INDICES``         host GPU indices
``elastico.io/sm-share``            ``ELASTICO_SM_SHARE``            (0, 1], default 1
``elastico.io/mps``                 ``ELASTICO_MPS``                 MPS limits, default off
``elastico.io/profiling``           ``ELASTICO_PROFILING``           preload the shim
=================================== ================================ =====================
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

from elastico_extender.annotations import (
    ASSIGNED_DEVICES,
    ASSIGNED_KNOBS,
    DEVICE_MEMORY,
    MEMORY_BUDGET,
    MPS,
    SM_SHARE,
    WORKLOAD_KIND,
)
from elastico_extender.core.handoff import (
    MIN_DEVICE_MIB,
    framework_settings,
    framework_share,
    knob_problems,
    vllm_arguments,
)
from elastico_extender.core.model import Configuration, JobKind
from elastico_extender.errors import AnnotationError

__all__ = ["PREFIX", "Assignment", "LaunchSettings", "read_assignment"]

PREFIX = "elastico.io/"
# Logical field -> (annotation name after the prefix, environment fallback).
FIELDS: dict[str, tuple[str, str]] = {
    "kind": (WORKLOAD_KIND, "ELASTICO_WORKLOAD_KIND"),
    "configuration": (ASSIGNED_KNOBS, "ELASTICO_CONFIGURATION_JSON"),
    "memory-budget-mib": (MEMORY_BUDGET, "ELASTICO_MEMORY_BUDGET_MIB"),
    "device-memory-mib": (DEVICE_MEMORY, "ELASTICO_DEVICE_MEMORY_MIB"),
    "gpu-indices": (ASSIGNED_DEVICES, "ELASTICO_GPU_INDICES"),
    "sm-share": (SM_SHARE, "ELASTICO_SM_SHARE"),
    "mps": (MPS, "ELASTICO_MPS"),
    "profiling": ("profiling", "ELASTICO_PROFILING"),
}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class LaunchSettings:
    """What changes in the workload's launch: environment additions and extra arguments."""

    env: Mapping[str, str]
    vllm_args: tuple[str, ...]
    profiling: bool


@dataclass(frozen=True)
class Assignment:
    kind: JobKind
    configuration: Configuration
    memory_budget_mib: float
    device_memory_mib: float
    gpu_indices: tuple[int, ...]
    sm_share: float
    mps: bool
    profiling: bool

    def settings(self) -> LaunchSettings:
        """Framework-native settings from ``core.handoff`` (the one mapping)."""
        env = framework_settings(
            kind=self.kind,
            configuration=self.configuration,
            memory_budget_mib=self.memory_budget_mib,
            device_memory_mib=self.device_memory_mib,
            device_indices=self.gpu_indices,
            sm_share=self.sm_share,
            mps=self.mps,
        )
        args: tuple[str, ...] = ()
        if self.kind is JobKind.INFERENCE:
            # the one share (rounded down) that ELASTICO_VLLM_ARGS carries
            share = framework_share(self.memory_budget_mib, self.device_memory_mib, self.mps)
            args = tuple(vllm_arguments(self.configuration, share.value))
        return LaunchSettings(env=env, vllm_args=args, profiling=self.profiling)


def _lookup(
    name: str, annotations: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[str | None, str]:
    """The raw value and where it came from (for error messages)."""
    annotation, env = FIELDS[name]
    key = PREFIX + annotation
    if key in annotations:
        return annotations[key], key
    return environ.get(env), env


def _sources(name: str) -> str:
    annotation, env = FIELDS[name]
    return f"annotation {PREFIX}{annotation} or environment variable {env}"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _knobs(raw: str) -> dict[str, int | float | bool | str] | str:
    """The knobs of ``raw`` (a JSON object of scalars), or what is wrong with it.  Python's
    json takes NaN and Infinity (a workload started with ELASTICO_BATCH_SIZE=nan), raises
    RecursionError past its nesting limit and ValueError for an integer of 4,300 digits:
    each is a problem of this field, never a traceback."""
    try:
        knobs = json.loads(raw, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        return f"not JSON: {exc.msg}"
    except ValueError as exc:
        return f"not JSON: {str(exc)[:120]}"
    except RecursionError:
        return "not JSON: nested too deeply"
    if not isinstance(knobs, dict) or not all(
        isinstance(v, int | float | bool | str) for v in knobs.values()
    ):
        return "must be a JSON object of scalar knob values"
    if any(isinstance(v, float) and not math.isfinite(v) for v in knobs.values()):
        return "a knob's number is out of range (1e400 reads as infinity)"
    problems = knob_problems(knobs)
    return "; ".join(problems) if problems else knobs


def read_assignment(annotations: Mapping[str, str], environ: Mapping[str, str]) -> Assignment:
    """Parse and validate; raises AnnotationError naming every bad or missing field."""
    problems: list[tuple[str, str]] = []

    def number(name: str, default: float | None = None) -> float:
        raw, where = _lookup(name, annotations, environ)
        if raw is None or raw == "":
            if default is None:
                problems.append((where, f"required ({_sources(name)})"))
                return math.nan
            return default
        try:
            value = float(raw)
        except ValueError:
            problems.append((where, f"not a number: {raw!r}"))
            return math.nan
        if not math.isfinite(value) or value <= 0:
            problems.append((where, f"must be a positive number, got {raw!r}"))
        return value

    def flag(name: str) -> bool:
        raw, where = _lookup(name, annotations, environ)
        text = (raw or "").strip().lower()
        if text in _TRUE:
            return True
        if text not in _FALSE:
            problems.append((where, f"expected true or false, got {raw!r}"))
        return False

    raw_kind, where = _lookup("kind", annotations, environ)
    kind = JobKind.TRAINING
    if raw_kind is None:
        problems.append((where, f"required: training or inference ({_sources('kind')})"))
    else:
        try:
            kind = JobKind(raw_kind.strip().lower())
        except ValueError:
            problems.append((where, f"expected training or inference, got {raw_kind!r}"))

    raw_config, where = _lookup("configuration", annotations, environ)
    configuration = Configuration(())
    if raw_config:
        knobs = _knobs(raw_config)
        if isinstance(knobs, str):
            problems.append((where, knobs))
        else:
            configuration = Configuration.from_dict(knobs)

    budget = number("memory-budget-mib")
    device = number("device-memory-mib")
    if 0 < device < MIN_DEVICE_MIB:  # named here: memory_share's ValueError names no field
        problems.append((_lookup("device-memory-mib", annotations, environ)[1],
                         f"must be at least 1 MiB, got {device:g}"))  # fmt: skip
    if math.isfinite(budget) and math.isfinite(device) and budget > device:
        problems.append(
            (PREFIX + MEMORY_BUDGET, f"budget {budget:g} MiB exceeds device memory {device:g} MiB")
        )
    sm_share = number("sm-share", default=1.0)
    if math.isfinite(sm_share) and sm_share > 1:
        problems.append((_lookup("sm-share", annotations, environ)[1], "must be in (0, 1]"))

    raw_gpus, where = _lookup("gpu-indices", annotations, environ)
    gpus: tuple[int, ...] = (0,)
    if raw_gpus:
        try:
            gpus = tuple(int(part) for part in raw_gpus.split(","))
            if any(g < 0 for g in gpus):
                raise ValueError
        except ValueError:
            problems.append((where, f"expected comma-separated GPU indices, got {raw_gpus!r}"))
        else:
            if len(set(gpus)) != len(gpus):  # bind writes distinct GPUs (read_decision)
                problems.append((where, f"a GPU is listed twice in {raw_gpus!r}"))

    mps = flag("mps")
    profiling = flag("profiling")
    if problems:
        raise AnnotationError(problems)
    return Assignment(kind, configuration, budget, device, gpus, sm_share, mps, profiling)
