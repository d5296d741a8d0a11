"""Planner settings: every default in one place, with its unit and why.

Symbols follow the spec (section 3): gamma0 switching cost, alpha interference
weight, gamma queue reservation, M rounds, eta step size, tau/beta tolerance.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

__all__ = [
    "COUNT_LIMITS",
    "MAX_MEMORY_MARGIN_MIB",
    "PlannerSettings",
    "StepSchedule",
    "assignments",
    "coerce_fields",
    "coerce_setting",
]

COUNT_LIMITS = {"max_rounds": 100, "max_price_iterations": 10_000, "bands": 32}
"""Largest value of each count setting.  Each is a loop bound or an array length per
epoch: bands=10**9 allocated gigabytes and max_rounds=10**9 would plan for ever; far
beyond these nothing changes (the spec's 2-3 rounds, 3-5 price iterations; band
thresholds grow geometrically, so 32 bands reach any job's service)."""
MAX_MEMORY_MARGIN_MIB = 1024.0 * 1024.0
"""Largest memory kept free per device (1 TiB): a margin no GPU holds would refuse
every job."""


class StepSchedule(StrEnum):
    FIXED = "fixed"  # eta_t = eta0
    SQRT = "sqrt"  # eta_t = eta0 / sqrt(t): guaranteed to settle, spec 3.2


@dataclass(frozen=True)
class PlannerSettings:
    # --- ESP (3.2) -------------------------------------------------------
    step_size: float = 1.0
    """eta0: price change per unit of *relative* over-demand (U - C) / C; dimensionless.
    1.0 means 10% over-demand raises the price by 0.1 score units per GPU-equivalent."""
    step_schedule: StepSchedule = StepSchedule.SQRT
    max_price_iterations: int = 40
    """Cap on tatonnement iterations I per round (spec: 3-5 typical with warm start)."""
    feasibility_slack: float = 0.0
    """Relative over-demand tolerated when declaring convergence (0 = strict)."""
    switch_cost: float = 0.05
    """gamma0: score added to every configuration other than the current one. 5% of a
    job's peak throughput: enough to stop flapping between near-equal configurations."""
    # --- IAC (3.3) -------------------------------------------------------
    interference_weight: float = 1.0
    """alpha: penalty per unit of slowdown above tolerance."""
    tau_default: float = 1.5
    """tau_base for a job without a throughput floor: keep >= 67% of solo throughput
    (spec Table 'interference cases': harmful pairs retain < 0.6)."""
    beta: float = 0.2
    """Sensitivity of tau to utilisation above/below target."""
    beta_max: float = 0.3
    """Hard cap on the utilisation bonus added to tau."""
    utilization_target: float = 0.8
    """U_target for tau, as a fraction of cluster SM capacity."""
    utilization_smoothing_s: float = 1800.0
    """Time constant of the exponential average of U(t) behind tau (seconds; 0 uses each
    plan's load as is).  Tau also decides when the closed loop separates a pair, so it
    must move slower than jobs come and go: following each plan, a pair admitted under a
    long queue was separated a minute after one job left, a gang requeued to wait hours.
    Half an hour: 64 GPUs at load 1.5 (24 h) 0.660x -> 0.638x Volcano's JCT, harm bound
    unchanged; it also slows tau's rise on a burst, which costs 0.6-2.5% on some
    production-world Philly weeks, where sharing is cheap (benchmarks/results/issue14/
    README.md, "Tau's load, smoothed")."""
    # --- PDS (3.4) -------------------------------------------------------
    max_rounds: int = 3
    """M: ESP -> pack -> IAC rounds per epoch (spec: 2-3)."""
    reservation: float = 0.5
    """gamma in C_eff = C - gamma * sum_{queued} R_min (0 ignores the queue, 1 reserves all)."""
    memory_margin_mib: float = 512.0
    """M_sys: per-device memory kept free for the driver and MPS (spec 4.2)."""
    # --- length-aware queueing (issue 14; planner.queueing) ---------------
    band_base_gpu_s: float = 3600.0
    """First priority-band threshold on a job's service key (GPU-seconds): one GPU-hour."""
    band_ratio: float = 4.0
    """Each further band threshold is this many times the previous one (1, 4, 16 GPU-h)."""
    bands: int = 4
    """Priority bands (Tiresias' discretised queues); 1 turns length awareness off."""
    band_decay: float = 0.5
    """ESP weight multiplier per band below the first: band b weighs decay**b."""
    weight_floor: float = 0.25
    """Smallest band multiplier: a long job's weight never drops below this share."""
    starvation_factor: float = 2.0
    """A queued job waiting longer than this times its expected remaining run time
    (at least ``band_base_gpu_s`` seconds) goes back to the first band."""
    patience_horizon_s: float = 1800.0
    """Longest expected wait for a GPU of its own for which a queued job declines to share
    (planner.patience): estimates are rough, so the rule only holds a job back briefly."""
    band_preemption: bool = True
    """Preempt a running job of a worse band of attained service for a queued job of a
    better one that fits nowhere else (planner.preempt: Tiresias' preemption, with the
    estimate's veto, each job at most once).  Philly at load 0.9 gains up to 11% in
    average JCT with p99 JCT within a few hours of off; False never stops a running job
    for the queue (benchmarks/results/issue14/band_preemption.md)."""
    preemption_min_run_s: float = 1800.0
    """Seconds a job runs after it (re)starts before band preemption may stop it again:
    every preemption costs a checkpoint and a restart, and a job that has just resumed
    must be allowed to make progress (anti-thrash)."""
    preemption_remaining_ratio: float = 4.0
    """Band preemption stops a running job only where its expected remaining GPU-time
    (the queue's service key) exceeds this many times the queued job's: SRPT's rule,
    with a margin for rough estimates, so a long job is not stopped for one about as
    long (that only moves the wait, and p99 JCT rose 10 h on Philly without it)."""
    # --- ablation switches (spec 5.2); all True is full ElastiCo --------
    reshape: bool = True
    """RST: False pins every job to its default (fastest) configuration."""
    pricing: bool = True
    """ESP: False replaces price-driven selection with greedy first-fit."""
    interference_check: bool = True
    """IAC: False admits co-locations without predicting slowdown."""
    coordination: bool = True
    """PDS: False drops queue reservation and switching cost (uncoordinated reconfiguration)."""
    length_aware: bool = True
    """Queueing by attained service and predicted remaining time; False: weight, then FIFO."""
    observed_sm: bool = True
    """Closed loop: charge a running job observed long enough its observed peak SM activity
    (planner.observed_sm) instead of its catalog SM share; False: catalog shares always."""

    observed_throughput: bool = True
    """Closed loop: rank a family's configurations by the solo rates measured there
    (planner.observed_throughput) instead of the profile's T(c); False: profiles always."""
    gang_band: bool = False
    """Closed loop: True makes a job of more than one GPU clear a wider admission band than
    a one-GPU job (planner.band, ``WIDE_JOB_BAND``).  Off by default: it gains on wide
    gangs of saturating jobs at high load and loses on real Philly weeks
    (benchmarks/results/loop/README.md, "Session 31")."""

    def __post_init__(self) -> None:
        if not isinstance(self.step_schedule, StepSchedule):
            with contextlib.suppress(ValueError):  # an invalid value is reported by problems()
                object.__setattr__(self, "step_schedule", StepSchedule(self.step_schedule))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], label: str = "planner.") -> PlannerSettings:
        """The defaults with ``values`` (field name -> value) applied.

        Values may be strings (environment variables, ``NAME=VALUE`` flags): each is
        coerced to its field's type.  Raises ValueError listing every unknown name and
        every invalid value, each named ``label`` + field, so an operator's settings file
        is fixed in one pass.
        """
        coerced, found = coerce_fields(cls, values, label)
        settings = replace(cls(), **coerced)
        found.extend(label + problem for problem in settings.problems())
        if found:
            raise ValueError("; ".join(found))
        return settings

    def changed(self) -> dict[str, Any]:
        """Fields that differ from the defaults (what a start-up log or a report shows)."""
        default = type(self)()
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }

    def problems(self) -> list[str]:
        """Every invalid setting, each naming the field."""
        found = []
        if not isinstance(self.step_schedule, StepSchedule):
            found.append(
                f"step_schedule must be one of {[m.value for m in StepSchedule]}, "
                f"got {self.step_schedule!r}"
            )
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "step_schedule" or isinstance(value, bool):
                continue
            if not isinstance(value, int | float) or not 0 <= value < math.inf:
                found.append(f"{f.name} must be a finite non-negative number, got {value!r}")
        for name, most in COUNT_LIMITS.items():
            value = getattr(self, name)
            if not 1 <= value <= most or value != int(value):
                found.append(f"{name} must be a whole number in [1, {most}], got {value!r}")
        if self.memory_margin_mib > MAX_MEMORY_MARGIN_MIB:
            found.append(
                f"memory_margin_mib must be at most {MAX_MEMORY_MARGIN_MIB:,.0f} MiB (no GPU holds "
                f"more), got {self.memory_margin_mib:g}"
            )
        if not 0 <= self.reservation <= 1:
            found.append("reservation must lie in [0, 1]")
        if self.tau_default < 1:
            found.append("tau_default must be >= 1 (a slowdown ratio)")
        if self.utilization_target <= 0:
            found.append("utilization_target must be > 0")
        if self.band_ratio <= 1:
            found.append("band_ratio must be > 1")
        if not 0 < self.band_decay <= 1:
            found.append("band_decay must lie in (0, 1]")
        if not 0 < self.weight_floor <= 1:
            found.append("weight_floor must lie in (0, 1]")
        if self.preemption_remaining_ratio < 1:
            found.append("preemption_remaining_ratio must be >= 1")
        return found


def coerce_fields(
    cls: type, values: Mapping[str, Any], label: str = ""
) -> tuple[dict[str, Any], list[str]]:
    """``values`` (field name -> raw value) coerced to the types of dataclass ``cls``'s
    fields, and every problem: an unknown name or a value of the wrong type, each named
    ``label`` + field.  One rule for the service's settings and the planner's."""
    declared = {f.name: str(f.type) for f in fields(cls)}
    coerced: dict[str, Any] = {}
    found = [f"{label}{name}: unknown setting" for name in values if name not in declared]
    for name, raw in values.items():
        if name in declared:
            try:
                coerced[name] = coerce_setting(raw, declared[name])
            except (TypeError, ValueError) as exc:
                found.append(f"{label}{name}: {exc}")
    return coerced, found


def coerce_setting(raw: Any, declared: str) -> Any:
    """``raw`` (from a file, the environment or a flag) as the type named ``declared``.

    ``declared`` is a dataclass field's annotation as text (``"float"``, ``"int | None"``,
    ``"bool"``, ...); anything else is kept as a string (an enum's own constructor
    checks it).  Raises TypeError or ValueError saying what was expected.
    """
    if raw is None:
        return None
    if "bool" in declared:
        if isinstance(raw, bool):
            return raw
        lowered = str(raw).strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"expected a boolean, got {raw!r}")
    if declared.startswith("int | None") and str(raw).strip().lower() in ("", "none", "null"):
        return None
    for kind, convert, expected in (("int", _whole, "an integer"), ("float", float, "a number")):
        if kind not in declared:
            continue
        if isinstance(raw, bool | dict | list):
            raise TypeError(f"expected {expected}, got {raw!r}")
        try:
            return convert(raw)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"expected {expected}, got {_shown(raw)}") from None
    if isinstance(raw, dict | list):
        raise TypeError(f"expected a string, got {type(raw).__name__}")
    return str(raw)


def _whole(raw: Any) -> int:
    """An integer setting: ``8``, ``"8"``, ``8.0`` or ``"8.0"``; never a truncated ``8.5``
    (a port of 8888.5 listened on 8888) nor an infinity (OverflowError)."""
    if isinstance(raw, int):
        return raw
    try:
        return int(str(raw).strip())
    except ValueError:
        value = float(raw)
    if not value.is_integer():  # nan and infinities are not either
        raise ValueError(value)
    return int(value)


def _shown(raw: Any) -> str:
    """``raw`` for a message, cut to 40 characters (a 400-digit number is not read)."""
    text = repr(raw)
    return text if len(text) <= 40 else text[:40] + "..."


def assignments(texts: Iterable[str], option: str) -> dict[str, str]:
    """``["tau_default=1.4", ...]`` (repeated ``NAME=VALUE`` flags) as a mapping; the
    last of a repeated name wins.  ValueError names ``option`` and the bad text."""
    out: dict[str, str] = {}
    for text in texts:
        name, sep, value = text.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{option}: expected NAME=VALUE, got {text!r}")
        out[name.strip()] = value.strip()
    return out
