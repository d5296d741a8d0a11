"""Profiling procedure (spec 4.1): warm-up, window, trimmed means, store, features."""

from __future__ import annotations

import math
import os
import subprocess

import numpy as np
import pytest
from conftest import fakes

from elastico_extender.core.interference.features import JOB_FEATURES
from elastico_extender.core.model import Configuration, JobKind
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM
from elastico_extender.profiles.store import ProfileStore
from elastico_extender.profiling.hardware import HardwareSample, NullSource
from elastico_extender.profiling.procedure import (
    ProcessStats,
    ProfilingError,
    ProfilingPlan,
    ProfilingSession,
    Sample,
    construct_profile,
    trimmed_mean,
    write_profile,
)
from elastico_extender.profiling.ring import RingReader, ShimSummary, find_rings, summarize

CONFIG = Configuration.from_dict({"batch_size": 32, "checkpointing": True, "amp": False})


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1.0] * 8 + [100.0, -50.0], 1.0),  # one outlier each side is cut
        ([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 5.5),
        ([4.0], 4.0),  # too few to trim: plain mean
        ([2.0, math.nan, 4.0], 3.0),  # NaN readings are skipped
    ],
)
def test_trimmed_mean_drops_the_outer_deciles(values: list[float], expected: float) -> None:
    assert trimmed_mean(values) == pytest.approx(expected)


def test_trimmed_mean_of_nothing_is_nan() -> None:
    assert math.isnan(trimmed_mean([]))


class FakeJob:
    """A job on a fake clock: slow warm-up, then 100 items/s at 2 items per iteration,
    with a GC stall every 15 s (no progress for a second, then catch-up)."""

    def __init__(self, clock: list[float], warm_seconds: float = 10.0) -> None:
        self.clock = clock
        self.warm = warm_seconds

    def read(self) -> tuple[float, float]:
        t = self.clock[0]
        if t < self.warm:
            items = 10.0 * t
        else:
            steady = t - self.warm
            stalls = math.floor(steady / 15.0)
            in_stall = steady % 15.0 < 1.0 and steady >= 15.0
            items = 10.0 * self.warm + 100.0 * (steady - (1.0 if in_stall else 0.0))
            del stalls
        return items / 2.0, items


class FakeHardware:
    name = "fake"

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def sample(self) -> HardwareSample | None:
        spike = 1.0 if int(self.clock[0]) % 20 == 7 else 0.0
        return HardwareSample(
            sm_active=min(1.0, 0.6 + spike),
            sm_occupancy=0.3,
            dram_active=0.4,
            fb_used_mib=10240.0,
            tensor_active=0.2,
        )

    def signature(self) -> str | None:
        return "NVIDIA A100-SXM4-40GB"


def session(clock: list[float], plan: ProfilingPlan, hardware=None) -> ProfilingSession:
    def sleep(seconds: float) -> None:
        clock[0] += seconds

    return ProfilingSession(
        FakeJob(clock), hardware or FakeHardware(clock), plan, clock=lambda: clock[0], sleep=sleep
    )


def test_session_warms_up_then_measures_a_full_window() -> None:
    clock = [0.0]
    plan = ProfilingPlan(warmup_iterations=10_000, warmup_seconds=12.0, window_seconds=60.0)
    samples = session(clock, plan).collect()
    assert samples[0].time == 0.0 and samples[-1].time == pytest.approx(72.0)
    profile = construct_profile(
        samples, kind=JobKind.TRAINING, configuration=CONFIG, param_count=1.3e9, plan=plan
    )
    assert profile.window == (12.0, 72.0)
    assert profile.throughput == pytest.approx(100.0)  # stalls and catch-ups trimmed
    assert profile.iteration_seconds == pytest.approx(0.02)
    assert profile.hardware["sm_active"] == pytest.approx(0.6)  # spikes trimmed
    assert profile.resources[GPU_SM] == pytest.approx(0.6)
    assert profile.resources[GPU_MEM] == pytest.approx(10240.0)
    assert not profile.estimated_sm


def test_warmup_ends_at_the_iteration_budget_when_that_comes_first() -> None:
    clock = [0.0]
    plan = ProfilingPlan(warmup_iterations=50, warmup_seconds=30.0, window_seconds=20.0)
    samples = session(clock, plan).collect()
    profile = construct_profile(
        samples, kind=JobKind.TRAINING, configuration=CONFIG, param_count=1.3e9, plan=plan
    )
    assert profile.window[0] == 10.0  # 10 items/s, 2 items per iteration: 50 iterations at 10 s


def test_profile_goes_to_the_store_with_signature_and_features() -> None:
    clock = [0.0]
    plan = ProfilingPlan(warmup_seconds=12.0, window_seconds=30.0)
    hardware = FakeHardware(clock)
    profile = construct_profile(
        session(clock, plan, hardware).collect(),
        kind=JobKind.TRAINING,
        configuration=CONFIG,
        param_count=1.3e9,
        plan=plan,
    )
    store = ProfileStore()
    write_profile(
        store,
        workload="gpt2-xl",
        hardware_signature=hardware.signature() or "",
        configuration=CONFIG,
        profile=profile,
        measured_at=1234.0,
    )
    (record,) = store.records("gpt2-xl", "NVIDIA A100-SXM4-40GB")
    assert record.configuration.as_dict() == CONFIG.as_dict() and record.measured_at == 1234.0
    assert record.throughput == pytest.approx(100.0)
    named = dict(zip(JOB_FEATURES, record.features, strict=True))
    assert named["sm_active"] == pytest.approx(0.6)
    assert named["fb_used_gib"] == pytest.approx(10.0)
    assert named["micro_batch_log2"] == pytest.approx(5.0)
    assert named["checkpointing"] == 1.0 and named["amp"] == 0.0
    assert named["log10_throughput"] == pytest.approx(2.0)
    assert named["is_inference"] == 0.0


def test_without_hardware_the_shim_supplies_memory_and_sm_is_a_whole_gpu() -> None:
    clock = [0.0]
    plan = ProfilingPlan(warmup_seconds=12.0, window_seconds=20.0)
    samples = session(clock, plan, NullSource()).collect()
    shim = ShimSummary(peak_bytes=3 * 2**30)
    profile = construct_profile(
        samples,
        kind=JobKind.INFERENCE,
        configuration=Configuration.from_dict({"max_num_seqs": 64}),
        param_count=7e9,
        plan=plan,
        shim=shim,
    )
    assert profile.resources[GPU_SM] == 1.0 and profile.estimated_sm
    assert profile.resources[GPU_MEM] == pytest.approx(3072.0)
    assert profile.hardware == dict.fromkeys(profile.hardware)
    assert profile.features[5] == 1.0  # is_inference


def test_cpu_and_host_memory_come_from_process_samples() -> None:
    samples = [
        Sample(float(t), 10.0 * t, 20.0 * t, None, cpu_seconds=1.5 * t, rss_mib=2048.0)
        for t in range(40)
    ]
    plan = ProfilingPlan(warmup_seconds=5.0, window_seconds=30.0)
    profile = construct_profile(
        samples, kind=JobKind.TRAINING, configuration=CONFIG, param_count=1e8, plan=plan
    )
    assert profile.resources[CPU] == pytest.approx(1.5)
    assert profile.resources[HOST_MEM] == pytest.approx(2048.0)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([Sample(0.0, 0.0, 0.0)], "fewer than two"),
        ([Sample(float(t), 0.0, 0.0) for t in range(5)], "warm-up"),
        ([Sample(float(t), 200.0, 5.0) for t in range(5)], "no progress"),
    ],
)
def test_unusable_measurements_raise(samples: list[Sample], message: str) -> None:
    plan = ProfilingPlan(warmup_iterations=100, warmup_seconds=30.0, window_seconds=3.0)
    with pytest.raises(ProfilingError, match=message):
        construct_profile(
            samples, kind=JobKind.TRAINING, configuration=CONFIG, param_count=1.0, plan=plan
        )


def test_process_stats_reads_this_process() -> None:
    cpu, rss = ProcessStats(os.getpid()).read()
    assert cpu is not None and cpu > 0 and rss is not None and rss > 1
    assert ProcessStats(2**22 + 12345).read() == (None, None)


def test_features_are_finite_for_the_store() -> None:
    samples = [Sample(float(t), float(t), float(t)) for t in range(40)]
    profile = construct_profile(
        samples,
        kind=JobKind.TRAINING,
        configuration=CONFIG,
        param_count=0.0,
        plan=ProfilingPlan(warmup_seconds=1.0, window_seconds=10.0),
    )
    assert np.isfinite(profile.features).all() and profile.features.shape == (14,)


def test_software_dimension_from_a_real_shim_run(tmp_path) -> None:
    """The shim's decoded peak allocation becomes the profile's GPU memory."""
    built = fakes.build_all(tmp_path / "build")
    env = {**os.environ, "LD_PRELOAD": str(built.shim), "ELASTICO_SHIM_DIR": str(tmp_path)}
    subprocess.run([str(built.workload), "2", "20"], env=env, check=True, capture_output=True)
    (path,) = find_rings(tmp_path).values()
    with RingReader(path) as ring:
        summary = summarize(ring.peek(), ring.header())
    assert summary.peak_bytes >= 2**20
    samples = [Sample(float(t), float(t), 8.0 * t) for t in range(20)]
    profile = construct_profile(
        samples,
        kind=JobKind.TRAINING,
        configuration=CONFIG,
        param_count=1e8,
        plan=ProfilingPlan(warmup_seconds=2.0, window_seconds=10.0),
        shim=summary,
    )
    assert profile.resources[GPU_MEM] == pytest.approx(summary.peak_bytes / 2**20)
    assert profile.throughput == pytest.approx(8.0)
