"""Built-in RST catalog: the 12 workloads of the spec's table "Workloads used in evaluation".

No GPU is needed to plan with these: each family's R(c) and T(c) come from a
small analytic model, calibrated to the figures the spec gives, and stand in
until the profiler (spec 4.1) stores measured profiles, which then take
precedence (see ``elastico_extender.profiles``).  All figures are for the
spec's testbed GPU, an A100-SXM4-40GB (40,960 MiB).

How R and T are derived
-----------------------

Training (knobs: micro-batch ``bs``, ``checkpointing``, ``amp``)::

    s        = bs / bs_max
    mem(c)   = W + A * s * (k_ck if checkpointing) * (k_amp if amp)      GiB
    eff(bs)  = bs / (bs + bs_half)            (arithmetic intensity saturates)
    T(c)     = T_peak * eff(bs)/eff(bs_max) * (ck_factor if ck) * (amp_factor if amp)
    sm(c)    = sm_peak * (0.6 + 0.4 * s) * (1.05 if ck) * (0.9 if amp)

W is the static part (weights, optimizer state, workspace) and A the
activation memory at the largest batch.  Where the spec gives only a memory
range, W and A are solved so the range is met exactly with the generic
k_ck = 0.4, k_amp = 0.6.  BERT and ResNet-50 are anchored to spec 5.3 Case 1
instead (BERT with checkpointing 24 GB, ResNet-50 with AMP 14 GB, both at the
largest batch); their minimum then lands at 22.3 GB (table: 24) and 11.1 GB
(table: 12).  The spec's case studies treat AMP as a memory saving that costs
a few percent of throughput (Case 2: "8-12% per-job throughput reduction"), so
the peak-throughput configuration is also the peak-memory one; the AMP factor
is < 1 here for that reason.

Offline inference (vLLM knobs: ``max_num_seqs`` B, ``max_model_len`` L,
``prefix_caching``, ``gpu_memory_utilization`` MU)::

    mem(c)      = MU * device memory            (vLLM pre-allocates its whole budget)
    kv_free     = mem - weights - 1.5 GiB runtime - B * request_len * kv_bytes/token
    hit(c)      = prefix_share * min(1, kv_free / prefix_working_set)   if prefix caching
    T(c)        = T_peak * (B/(B+0.6)) / (4/4.6) * min(1, L/request_len)**0.5 * (1 + 0.6*hit)
                  normalised so the best configuration reaches T_peak

so a larger cap buys prefix-cache hits (faster prefill) and a longer L admits
the dataset's long requests; KV bytes per token come from each model's layer
count, KV heads and head size.

CPU and host memory: 4 cores / 16 GiB per training worker, 2 cores and twice
the weights (+8 GiB) per inference engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from elastico_extender.core.interference.features import job_features
from elastico_extender.core.model import Configuration, JobKind, ProfileFamily
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, MIB_PER_GIB
from elastico_extender.core.shapes.knobs import KnobSpace, memory_utilization_steps, powers_of_two
from elastico_extender.errors import UnknownWorkloadError

__all__ = [
    "A100_40GB",
    "CATALOG",
    "REFERENCE_DEVICE_MIB",
    "InferenceSpec",
    "TrainingSpec",
    "build_family",
    "catalog_families",
    "family_from_spec",
    "knob_space",
]

A100_40GB = "A100-SXM4-40GB"
REFERENCE_DEVICE_MIB = 40 * 1024.0
_GENERIC_K_CK = 0.4
_GENERIC_K_AMP = 0.6
_RUNTIME_GIB = 1.5


@dataclass(frozen=True)
class TrainingSpec:
    name: str
    mem_range_gib: tuple[float, float]
    batch_sizes: tuple[int, ...]
    peak_throughput: float  # samples/s at (bs_max, no ck, no amp)
    batch_half: float
    params: float
    sm_peak: float
    dram: float
    tensor: float
    ck_factor: float = 0.75
    amp_factor: float = 0.95
    anchors: tuple[float, float, float] | None = None  # explicit (W, A, k_ck or k_amp tuple)
    k_ck: float = _GENERIC_K_CK
    k_amp: float = _GENERIC_K_AMP

    def memory_model(self) -> tuple[float, float, float, float]:
        """(W, A, k_ck, k_amp) in GiB; solved from the memory range unless anchored."""
        if self.anchors is not None:
            static, act, _ = self.anchors
            return static, act, self.k_ck, self.k_amp
        low, high = self.mem_range_gib
        s_min = min(self.batch_sizes) / max(self.batch_sizes)
        act = (high - low) / (1.0 - s_min * self.k_ck * self.k_amp)
        return high - act, act, self.k_ck, self.k_amp


@dataclass(frozen=True)
class InferenceSpec:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    peak_tokens_per_s: float
    max_num_seqs: tuple[int, ...]
    max_model_len: tuple[int, ...]
    mu_range: tuple[float, float]
    request_len: int  # typical input + output tokens of the offline dataset
    input_len: int
    prefix_share: float
    sm_peak: float = 0.5
    dram: float = 0.65
    tensor: float = 0.2

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2.0  # K and V, bf16

    @property
    def weights_gib(self) -> float:
        return self.params * 2.0 / 2**30


_T = TrainingSpec
_I = InferenceSpec
CATALOG: Mapping[str, TrainingSpec | InferenceSpec] = MappingProxyType(
    {
        s.name: s
        for s in (
            _T(
                "resnet50",
                (12, 24),
                powers_of_two(32, 512),
                1100.0,
                48.0,
                25.6e6,
                0.45,
                0.55,
                0.45,
                anchors=(11.0, 13.0, 0.0),
                k_amp=3.0 / 13.0,
            ),
            _T(
                "bert",
                (24, 36),
                powers_of_two(32, 128),
                180.0,
                16.0,
                340e6,
                0.50,
                0.45,
                0.55,
                anchors=(22.0, 14.0, 0.0),
                k_ck=2.0 / 14.0,
            ),
            _T("dcgan", (8, 16), powers_of_two(32, 512), 2500.0, 64.0, 3.6e6, 0.40, 0.50, 0.30),
            _T("pointnet", (12, 20), powers_of_two(32, 512), 1800.0, 40.0, 3.5e6, 0.35, 0.40, 0.20),
            _T(
                "transformer", (20, 38), powers_of_two(32, 512), 420.0, 40.0, 65e6, 0.55, 0.50, 0.50
            ),
            _T(
                "lstm",
                (4, 12),
                powers_of_two(32, 4096),
                9000.0,
                256.0,
                20e6,
                0.30,
                0.35,
                0.25,
                ck_factor=0.8,
            ),
            _T(
                "ncf",
                (4, 16),
                powers_of_two(32, 8192),
                250_000.0,
                512.0,
                30e6,
                0.25,
                0.60,
                0.10,
                ck_factor=0.85,
                amp_factor=0.97,
            ),
            _T(
                "ppo",
                (8, 24),
                powers_of_two(32, 4096),
                6000.0,
                128.0,
                1e6,
                0.30,
                0.30,
                0.10,
                ck_factor=0.85,
                amp_factor=0.97,
            ),
            _I(
                "deepseek-1.5b",
                1.78e9,
                28,
                2,
                128,
                2400.0,
                (1, 2, 4),
                (4096, 8192, 16384),
                (0.4, 0.9),
                8192,
                1024,
                0.5,
            ),
            _I(
                "qwen-1.7b",
                1.72e9,
                28,
                8,
                128,
                2200.0,
                (1, 2, 4),
                (4096, 8192, 16384),
                (0.4, 0.9),
                6144,
                1536,
                0.5,
            ),
            _I(
                "mistral-7b",
                7.24e9,
                32,
                8,
                128,
                900.0,
                (1, 2, 4),
                (1024, 2048, 4096),
                (0.7, 0.9),
                2048,
                1024,
                0.4,
                sm_peak=0.55,
            ),
            _I(
                "llama3-7b",
                8.03e9,
                32,
                8,
                128,
                850.0,
                (1, 2, 4),
                (1024, 2048, 4096),
                (0.7, 0.9),
                2048,
                1024,
                0.4,
                sm_peak=0.55,
            ),
        )
    }
)


def knob_space(spec: TrainingSpec | InferenceSpec) -> KnobSpace:
    """The knob space of a catalog workload (its Cartesian product is the family)."""
    if isinstance(spec, TrainingSpec):
        return KnobSpace.of(
            batch_size=spec.batch_sizes, checkpointing=(False, True), amp=(False, True)
        )
    return KnobSpace.of(
        max_num_seqs=spec.max_num_seqs,
        max_model_len=spec.max_model_len,
        prefix_caching=(False, True),
        gpu_memory_utilization=memory_utilization_steps(*spec.mu_range),
    )


def _training_family(spec: TrainingSpec, device_mib: float, hardware: str) -> ProfileFamily:
    configs = knob_space(spec).configurations()
    bs = np.array([c["batch_size"] for c in configs], dtype=np.float64)
    ck = np.array([bool(c["checkpointing"]) for c in configs])
    amp = np.array([bool(c["amp"]) for c in configs])
    static, act, k_ck, k_amp = spec.memory_model()
    s = bs / bs.max()
    mem_gib = static + act * s * np.where(ck, k_ck, 1.0) * np.where(amp, k_amp, 1.0)
    eff = bs / (bs + spec.batch_half)
    eff_max = bs.max() / (bs.max() + spec.batch_half)
    throughput = (
        spec.peak_throughput
        * eff
        / eff_max
        * np.where(ck, spec.ck_factor, 1.0)
        * np.where(amp, spec.amp_factor, 1.0)
    )
    sm = np.minimum(
        1.0, spec.sm_peak * (0.6 + 0.4 * s) * np.where(ck, 1.05, 1.0) * np.where(amp, 0.9, 1.0)
    )
    resources = np.zeros((len(configs), 4))
    resources[:, GPU_SM] = sm
    resources[:, GPU_MEM] = mem_gib * MIB_PER_GIB
    resources[:, CPU] = 4.0
    resources[:, HOST_MEM] = 16.0 * MIB_PER_GIB
    hardware_metrics = np.column_stack(
        [
            sm,
            np.clip(0.3 + 0.5 * eff, 0, 1),  # occupancy rises with batch size
            np.clip(spec.dram * (0.7 + 0.3 * s) * np.where(amp, 0.8, 1.0), 0, 1),
            mem_gib,
            np.clip(spec.tensor * np.where(amp, 1.6, 0.6), 0, 1),
        ]
    )
    features = job_features(
        hardware=hardware_metrics,
        is_inference=False,
        param_count=spec.params,
        throughput=throughput,
        batch_size=bs,
        checkpointing=ck.astype(float),
        amp=amp.astype(float),
    )
    del device_mib  # training memory does not scale with the device
    return ProfileFamily(
        workload=spec.name,
        kind=JobKind.TRAINING,
        configs=configs,
        resources=resources,
        throughput=throughput,
        features=features,
        hardware=hardware,
        throughput_unit="samples/s",
        param_count=spec.params,
    )


def _inference_family(spec: InferenceSpec, device_mib: float, hardware: str) -> ProfileFamily:
    configs = knob_space(spec).configurations()
    seqs = np.array([c["max_num_seqs"] for c in configs], dtype=np.float64)
    max_len = np.array([c["max_model_len"] for c in configs], dtype=np.float64)
    prefix = np.array([bool(c["prefix_caching"]) for c in configs])
    mu = np.array([c["gpu_memory_utilization"] for c in configs], dtype=np.float64)
    mem_gib = mu * device_mib / MIB_PER_GIB
    live_tokens = seqs * np.minimum(max_len, spec.request_len)
    kv_free_gib = (
        mem_gib - spec.weights_gib - _RUNTIME_GIB - live_tokens * spec.kv_bytes_per_token / 2**30
    )
    working_set_gib = 256 * spec.input_len * spec.kv_bytes_per_token / 2**30  # 256 hot prefixes
    hit = np.where(
        prefix, spec.prefix_share * np.clip(kv_free_gib / working_set_gib, 0.0, 1.0), 0.0
    )
    raw = (
        (seqs / (seqs + 0.6))
        / (4 / 4.6)
        * np.minimum(1.0, max_len / spec.request_len) ** 0.5
        * (1.0 + 0.6 * hit)
    )
    throughput = spec.peak_tokens_per_s * raw / raw.max()
    sm = np.clip(spec.sm_peak * (0.55 + 0.45 * seqs / seqs.max()) * (1.0 - 0.2 * hit), 0, 1)
    resources = np.zeros((len(configs), 4))
    resources[:, GPU_SM] = sm
    resources[:, GPU_MEM] = mem_gib * MIB_PER_GIB
    resources[:, CPU] = 2.0
    resources[:, HOST_MEM] = (2.0 * spec.weights_gib + 8.0) * MIB_PER_GIB
    hardware_metrics = np.column_stack(
        [
            sm,
            np.clip(0.2 + 0.1 * seqs, 0, 1),
            np.clip(spec.dram * (0.8 + 0.2 * seqs / seqs.max()), 0, 1),
            mem_gib,
            np.full(len(configs), spec.tensor),
        ]
    )
    features = job_features(
        hardware=hardware_metrics,
        is_inference=True,
        param_count=spec.params,
        throughput=throughput,
        input_len=np.full(len(configs), float(spec.input_len)),
        output_len=np.full(len(configs), float(spec.request_len - spec.input_len)),
        prefix_ratio=hit,
    )
    return ProfileFamily(
        workload=spec.name,
        kind=JobKind.INFERENCE,
        configs=configs,
        resources=resources,
        throughput=throughput,
        features=features,
        hardware=hardware,
        throughput_unit="tokens/s",
        param_count=spec.params,
    )


def family_from_spec(
    spec: TrainingSpec | InferenceSpec,
    device_mib: float = REFERENCE_DEVICE_MIB,
    hardware: str = A100_40GB,
) -> ProfileFamily:
    """The profile family a (possibly user-defined) workload spec describes."""
    if isinstance(spec, TrainingSpec):
        return _training_family(spec, device_mib, hardware)
    return _inference_family(spec, device_mib, hardware)


def build_family(
    name: str, device_mib: float = REFERENCE_DEVICE_MIB, hardware: str = A100_40GB
) -> ProfileFamily:
    """The catalog's profile family for workload ``name`` on a device of ``device_mib``."""
    spec = CATALOG.get(name)
    if spec is None:
        raise UnknownWorkloadError(
            f"unknown workload {name!r}; catalog has: {', '.join(sorted(CATALOG))}"
        )
    return family_from_spec(spec, device_mib, hardware)


def catalog_families(
    device_mib: float = REFERENCE_DEVICE_MIB, hardware: str = A100_40GB
) -> dict[str, ProfileFamily]:
    """All 12 catalog families, keyed by workload name."""
    return {name: build_family(name, device_mib, hardware) for name in CATALOG}


def configuration_of(family: ProfileFamily, **knobs: object) -> Configuration:
    """Convenience for tests and examples: the configuration with these knob values."""
    return family.configs[family.index_of(knobs)]  # type: ignore[arg-type]
