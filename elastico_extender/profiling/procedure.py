"""The profiling procedure of spec 4.1: warm-up, measurement window, trimmed means, store.

Steps (ii)-(iv) of the spec; (i) launch and (v) stop belong to whoever runs the
profiling pod (``elastico-run`` with ``elastico.io/profiling=true``).

* warm-up ends at the first sample where ``warmup_iterations`` iterations are done or
  ``warmup_seconds`` have passed, whichever comes first (default 100 iterations / 30 s);
* the measurement window then lasts ``window_seconds`` (default 60 s), sampled every
  ``sample_seconds`` (default 1 s): cumulative progress (iterations, items), the hardware
  metrics, and the process's CPU time and resident memory;
* each quantity is reduced with the 10%-90% trimmed mean
  ``mean(sorted(x)[floor(0.1 n) : ceil(0.9 n)])`` so GC pauses or checkpoint I/O
  do not move the estimate; throughput is ``trimmed_mean(d items / d t)`` over the
  window's intervals and iteration time ``trimmed_mean(d t / d iterations)``;
* the profile ``R = (SM share, GPU MiB, CPU cores, host MiB)`` and ``T`` go to the
  profile store under the hardware signature, with the 14 per-job IAC features
  (``core.interference.features.job_features``).

GPU memory is the larger of the framebuffer reading and the shim's peak live
allocation; SM share is SM-active when a hardware source measured it, else 1.0 (a
whole GPU: the conservative choice) with ``estimated_sm`` set.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from elastico_extender.core.interference.features import job_features
from elastico_extender.core.model import Configuration, JobKind
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, NUM_RESOURCES
from elastico_extender.errors import ProfilingError
from elastico_extender.profiles.store import ProfileStore
from elastico_extender.profiling.hardware import (
    HardwareSample,
    HardwareSource,
    http_get,
    parse_prometheus,
)
from elastico_extender.profiling.ring import ShimSummary

__all__ = [
    "FileProgress",
    "MeasuredProfile",
    "ProcessStats",
    "ProfilingError",
    "ProfilingPlan",
    "ProfilingSession",
    "ProgressSource",
    "PrometheusProgress",
    "Sample",
    "construct_profile",
    "trimmed_mean",
    "write_profile",
]

MIB = 2.0**20


@dataclass(frozen=True)
class ProfilingPlan:
    warmup_iterations: int = 100  # iterations; spec: 50-100
    warmup_seconds: float = 30.0  # s; whichever of the two comes first
    window_seconds: float = 60.0  # s; the measurement window
    sample_seconds: float = 1.0  # s; hardware counters at 1 s resolution
    trim_low: float = 0.1
    trim_high: float = 0.9


@dataclass(frozen=True)
class Sample:
    """One observation; progress counters are cumulative since the job started."""

    time: float
    iterations: float
    items: float
    hardware: HardwareSample | None = None
    cpu_seconds: float | None = None  # cumulative CPU time of the workload
    rss_mib: float | None = None


def trimmed_mean(values: Sequence[float], low: float = 0.1, high: float = 0.9) -> float:
    """Mean of the sorted values between the ``low`` and ``high`` quantile positions."""
    data = sorted(v for v in values if math.isfinite(v))
    if not data:
        return math.nan
    n = len(data)
    kept = data[math.floor(low * n) : math.ceil(high * n)] or data
    return float(sum(kept) / len(kept))


@dataclass(frozen=True)
class MeasuredProfile:
    resources: np.ndarray  # (4,), units of core.resources
    throughput: float  # items per second
    iteration_seconds: float
    hardware: dict[str, float | None]
    features: np.ndarray  # (14,)
    window: tuple[float, float]
    samples_used: int
    estimated_sm: bool = False
    notes: tuple[str, ...] = field(default=())


def _warmed_up(plan: ProfilingPlan, started: float, now: float, iterations: float) -> bool:
    """Warm-up is over at the iteration budget or the time budget, whichever comes first."""
    return iterations >= plan.warmup_iterations or now - started >= plan.warmup_seconds


def _window(samples: Sequence[Sample], plan: ProfilingPlan) -> list[Sample]:
    if len(samples) < 2:
        raise ProfilingError("fewer than two samples")
    t0 = samples[0].time
    warm = next((s for s in samples if _warmed_up(plan, t0, s.time, s.iterations)), None)
    if warm is None:
        raise ProfilingError("the job never finished its warm-up")
    end = warm.time + plan.window_seconds
    window = [s for s in samples if warm.time <= s.time <= end + 1e-9]
    if len(window) < 2:
        raise ProfilingError("the measurement window holds fewer than two samples")
    return window


def construct_profile(
    samples: Sequence[Sample],
    *,
    kind: JobKind,
    configuration: Configuration,
    param_count: float,
    plan: ProfilingPlan | None = None,
    shim: ShimSummary | None = None,
) -> MeasuredProfile:
    """Steady-state R, T and features from raw samples (pure: no clock, no I/O)."""
    plan = plan or ProfilingPlan()
    window = _window(samples, plan)

    def trim(values: Sequence[float]) -> float:
        return trimmed_mean(values, plan.trim_low, plan.trim_high)

    pairs = list(itertools.pairwise(window))
    rates = [(b.items - a.items) / (b.time - a.time) for a, b in pairs if b.time > a.time]
    per_iter = [
        (b.time - a.time) / (b.iterations - a.iterations)
        for a, b in pairs
        if b.iterations > a.iterations
    ]
    throughput = trim(rates)
    if not (math.isfinite(throughput) and throughput > 0):
        raise ProfilingError("no progress during the measurement window")
    hardware: dict[str, float | None] = {}
    for name in HardwareSample.metric_names():
        values = [getattr(s.hardware, name) for s in window if s.hardware is not None]
        present = [v for v in values if v is not None]
        hardware[name] = trim(present) if present else None

    notes = []
    resources = np.zeros(NUM_RESOURCES)
    sm = hardware["sm_active"]
    resources[GPU_SM] = min(1.0, max(0.0, sm)) if sm is not None else 1.0
    if sm is None:
        notes.append("no SM measurement: a whole GPU assumed")
    fb = hardware["fb_used_mib"] or 0.0
    peak = shim.peak_bytes / MIB if shim is not None else 0.0
    resources[GPU_MEM] = max(fb, peak)
    if resources[GPU_MEM] == 0:
        notes.append("no GPU memory measurement (neither framebuffer nor shim)")
    cpu = [
        (b.cpu_seconds - a.cpu_seconds) / (b.time - a.time)
        for a, b in pairs
        if a.cpu_seconds is not None and b.cpu_seconds is not None and b.time > a.time
    ]
    resources[CPU] = max(0.0, trim(cpu)) if cpu else 0.0
    rss = [s.rss_mib for s in window if s.rss_mib is not None]
    resources[HOST_MEM] = trim(rss) if rss else 0.0

    knobs = configuration.as_dict()
    hw_row = [
        [
            hardware["sm_active"] or 0.0,
            hardware["sm_occupancy"] or 0.0,
            hardware["dram_active"] or 0.0,
            resources[GPU_MEM] / 1024.0,
            hardware["tensor_active"] or 0.0,
        ]
    ]

    def knob(name: str) -> np.ndarray | None:
        value = knobs.get(name)
        return None if value is None or isinstance(value, str) else np.array([float(value)])

    features = job_features(
        hardware=np.array(hw_row),
        is_inference=kind is JobKind.INFERENCE,
        param_count=param_count,
        throughput=np.array([throughput]),
        batch_size=knob("batch_size"),
        checkpointing=knob("checkpointing"),
        amp=knob("amp"),
        input_len=knob("input_len"),
        output_len=knob("output_len"),
        prefix_ratio=knob("prefix_ratio"),
    )[0]
    return MeasuredProfile(
        resources=resources,
        throughput=throughput,
        iteration_seconds=trim(per_iter) if per_iter else math.nan,
        hardware=hardware,
        features=features.astype(np.float64),
        window=(window[0].time, window[-1].time),
        samples_used=len(window),
        estimated_sm=sm is None,
        notes=tuple(notes),
    )


def write_profile(
    store: ProfileStore,
    *,
    workload: str,
    hardware_signature: str,
    configuration: Configuration,
    profile: MeasuredProfile,
    measured_at: float,
) -> None:
    """Step (iv): store R, T and the features under the hardware signature."""
    store.put(
        workload,
        hardware_signature,
        configuration,
        profile.resources,
        profile.throughput,
        profile.features,
        measured_at,
    )


class ProgressSource(Protocol):
    """Cumulative ``(iterations, items)`` done by the job so far (e.g. vLLM's
    ``vllm:generation_tokens_total`` counter, or a progress file); raises OSError when
    the reading is unavailable this time."""

    def read(self) -> tuple[float, float]: ...


class FileProgress:
    """Progress from a small text file ``"<iterations> <items>"`` that a framework callback
    or a log tailer keeps current (rewritten in place)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> tuple[float, float]:
        parts = self.path.read_text().split()
        if len(parts) < 2:
            raise OSError(f"{self.path}: expected '<iterations> <items>'")
        return float(parts[0]), float(parts[1])


class PrometheusProgress:
    """Progress from counters on a Prometheus endpoint, e.g. vLLM's ``/metrics`` with
    ``vllm:num_requests_success_total`` (iterations) and ``vllm:generation_tokens_total``
    (items); label sets are summed."""

    def __init__(
        self,
        url: str,
        iterations_metric: str,
        items_metric: str,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        self.url = url
        self.metrics = (iterations_metric, items_metric)
        self._fetch = fetch or http_get

    def read(self) -> tuple[float, float]:
        """OSError (the session's "no reading this time") for every failed read: the
        fetch's ValueError too (an answer over its bound, a URL it cannot fetch)."""
        try:
            text = self._fetch(self.url, 2.0)
        except ValueError as exc:
            raise OSError(str(exc)) from exc
        totals = dict.fromkeys(self.metrics, 0.0)
        for name, _labels, value in parse_prometheus(text):
            if name in totals:
                totals[name] += value
        return totals[self.metrics[0]], totals[self.metrics[1]]


class ProcessStats:
    """CPU seconds and resident MiB of one process, from /proc (Linux)."""

    def __init__(self, pid: int, proc: Path = Path("/proc")) -> None:
        self.pid = pid
        self.proc = proc
        self._tick = os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[float | None, float | None]:
        try:
            stat = (self.proc / str(self.pid) / "stat").read_text()
            status = (self.proc / str(self.pid) / "status").read_text()
        except OSError:
            return None, None
        fields_after_name = stat.rsplit(")", 1)[1].split()
        cpu = (int(fields_after_name[11]) + int(fields_after_name[12])) / self._tick
        rss = next(
            (
                int(line.split()[1]) / 1024.0
                for line in status.splitlines()
                if line.startswith("VmRSS:")
            ),
            None,
        )
        return cpu, rss


class ProfilingSession:
    """Drives steps (ii)-(iii): samples until warm-up plus the window have passed."""

    def __init__(
        self,
        progress: ProgressSource,
        hardware: HardwareSource,
        plan: ProfilingPlan | None = None,
        *,
        process: ProcessStats | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.progress = progress
        self.hardware = hardware
        self.plan = plan or ProfilingPlan()
        self.process = process
        self.clock = clock
        self.sleep = sleep

    def collect(self) -> list[Sample]:
        plan = self.plan
        samples: list[Sample] = []
        start = self.clock()
        warm_at: float | None = None
        while True:
            now = self.clock()
            try:
                iterations, items = self.progress.read()
            except OSError:
                iterations = items = math.nan
            cpu, rss = self.process.read() if self.process is not None else (None, None)
            if math.isfinite(iterations):
                samples.append(Sample(now, iterations, items, self.hardware.sample(), cpu, rss))
                if warm_at is None and _warmed_up(plan, start, now, iterations):
                    warm_at = now
            if warm_at is not None and now >= warm_at + plan.window_seconds:
                return samples
            if warm_at is None and now - start > plan.warmup_seconds + plan.window_seconds:
                raise ProfilingError("no progress readings during warm-up")
            self.sleep(plan.sample_seconds)
