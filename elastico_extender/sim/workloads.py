"""The simulator's view of the 12 catalog workloads: one flat table of every configuration.

Every (workload, configuration row) pair of :func:`catalog_families` gets a global
id ``gid``; per-gid arrays (SM share, memory, DRAM activity, true throughput...)
let the engine compute progress rates and ground-truth slowdowns with numpy
fancy indexing instead of per-job Python work.

Profile noise (ground truth kept apart from what the planner sees)
------------------------------------------------------------------
The planner plans with the catalog's T(c).  The simulated "real" throughput is

    T_true(c) = T_catalog(c) * exp(eps_c),   eps_c ~ N(0, sigma^2), sigma = 0.05 by default

drawn once per (workload, configuration) from the run's seed, so a configuration
the planner believes is 10% slower may really be 5% or 15% slower.  A job's *work*
is its trace duration at the default (fastest catalog) configuration run solo;
in configuration c it progresses at ``T_true(c) / T_true(default)`` of that rate,
divided by its true co-location slowdown.

Mapping to Gavel job types (for the measured co-location pairs)
---------------------------------------------------------------
Gavel measured 26 job types (7 models x batch sizes).  Each catalog training
workload maps to the Gavel model that is closest in architecture and
bottleneck, and its batch size maps onto Gavel's batch sizes by relative
position on a log scale (smallest to smallest, largest to largest):

===========  =====================  ==========================================
catalog      Gavel model            why
===========  =====================  ==========================================
resnet50     ResNet-50              same model (ImageNet)
bert         Transformer            transformer encoder; no BERT in Gavel
dcgan        CycleGAN               the only GAN measured
pointnet     ResNet-18              small conv/MLP net, CIFAR-scale inputs
transformer  Transformer            same model
lstm         LM                     Gavel's LM is an LSTM language model
ncf          Recommendation         Gavel's recommender (ML-20M)
ppo          A3C                    the only RL job measured
===========  =====================  ==========================================

Offline-inference workloads have no measured pairs (none exist publicly, see
../shared/data/README.md); their pairs use the documented contention model of
:mod:`.truth`.  Trace jobs that name a Gavel job type map back through the same
table (Transformer jobs alternate between bert and transformer by job id hash).
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.model import JobKind, ProfileFamily
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.shapes.catalog import catalog_families

__all__ = [
    "GAVEL_BATCH_SIZES",
    "GAVEL_MODEL_OF",
    "INFERENCE_WORKLOADS",
    "TRAINING_WORKLOADS",
    "ConfigTable",
    "workload_from_gavel",
]

GAVEL_MODEL_OF: dict[str, str] = {
    "resnet50": "ResNet-50",
    "bert": "Transformer",
    "dcgan": "CycleGAN",
    "pointnet": "ResNet-18",
    "transformer": "Transformer",
    "lstm": "LM",
    "ncf": "Recommendation",
    "ppo": "A3C",
}
GAVEL_BATCH_SIZES: dict[str, tuple[int, ...]] = {
    "ResNet-50": (16, 32, 64, 128),
    "ResNet-18": (16, 32, 64, 128, 256),
    "Transformer": (16, 32, 64, 128, 256),
    "LM": (5, 10, 20, 40, 80),
    "Recommendation": (512, 1024, 2048, 4096, 8192),
    "CycleGAN": (),
    "A3C": (),
}
TRAINING_WORKLOADS: tuple[str, ...] = tuple(GAVEL_MODEL_OF)
INFERENCE_WORKLOADS: tuple[str, ...] = ("deepseek-1.5b", "qwen-1.7b", "mistral-7b", "llama3-7b")


def workload_from_gavel(job_type: str, job_id: str = "") -> str:
    """Catalog workload for a Gavel job type string such as ``'LM (batch size 20)'``."""
    model = job_type.split(" (")[0].strip()
    matches = [w for w, m in GAVEL_MODEL_OF.items() if m == model]
    if not matches:
        raise ValueError(f"unknown Gavel job type {job_type!r}")
    if len(matches) == 1:
        return matches[0]
    return matches[zlib.crc32(job_id.encode()) % len(matches)]


def gavel_type(workload: str, batch_size: int, batch_sizes: tuple[int, ...]) -> str:
    """Gavel job type of a catalog training configuration (log-position batch mapping)."""
    model = GAVEL_MODEL_OF[workload]
    options = GAVEL_BATCH_SIZES[model]
    if not options:
        return model
    lo, hi = min(batch_sizes), max(batch_sizes)
    pos = 0.0 if hi == lo else math.log(batch_size / lo) / math.log(hi / lo)
    target = math.log(options[0]) + pos * (math.log(options[-1]) - math.log(options[0]))
    best = min(options, key=lambda b: abs(math.log(b) - target))
    return f"{model} (batch size {best})"


@dataclass(frozen=True, eq=False)
class ConfigTable:
    """Flat per-configuration arrays over all catalog families (index: gid)."""

    families: dict[str, ProfileFamily]
    offset: dict[str, int]
    workload: np.ndarray  # (C,) workload index into ``names``
    names: tuple[str, ...]
    row: np.ndarray  # (C,) configuration row within its family
    is_inference: np.ndarray  # (C,) bool
    sm: np.ndarray  # (C,) SM share (planner profile)
    mem_mib: np.ndarray  # (C,) memory (planner profile)
    dram: np.ndarray  # (C,) DRAM activity (IAC feature 2)
    t_catalog: np.ndarray  # (C,) planner throughput T(c)
    t_true: np.ndarray  # (C,) ground-truth throughput
    rate: np.ndarray  # (C,) T_true(c) / T_true(default of its workload)
    default_gid: np.ndarray  # (W,) gid of each workload's default (fastest) configuration
    gavel: tuple[str, ...]  # (C,) Gavel job type or "" (inference)
    params: np.ndarray  # (C,) parameter count

    @classmethod
    def build(cls, seed: int = 0, noise: float = 0.05) -> ConfigTable:
        families = catalog_families()
        names = tuple(families)
        offset: dict[str, int] = {}
        parts: dict[str, list[np.ndarray]] = {
            k: [] for k in ("w", "row", "inf", "sm", "mem", "dram", "t", "params")
        }
        gavel: list[str] = []
        default_gid = np.zeros(len(names), dtype=np.intp)
        total = 0
        for w, name in enumerate(names):
            fam = families[name]
            k = fam.size
            offset[name] = total
            default_gid[w] = total + fam.fastest_index
            parts["w"].append(np.full(k, w))
            parts["row"].append(np.arange(k))
            parts["inf"].append(np.full(k, fam.kind is JobKind.INFERENCE))
            parts["sm"].append(fam.resources[:, GPU_SM])
            parts["mem"].append(fam.resources[:, GPU_MEM])
            parts["dram"].append(fam.features[:, 2].astype(np.float64))
            parts["t"].append(fam.throughput)
            parts["params"].append(np.full(k, fam.param_count))
            if fam.kind is JobKind.TRAINING:
                sizes = tuple(int(c["batch_size"]) for c in fam.configs)
                gavel.extend(gavel_type(name, b, sizes) for b in sizes)
            else:
                gavel.extend([""] * k)
            total += k
        cat = {k: np.concatenate(v) for k, v in parts.items()}
        rng = np.random.default_rng([seed, 0x5EED])
        t_true = cat["t"] * np.exp(rng.normal(0.0, noise, total)) if noise > 0 else cat["t"].copy()
        w_idx = cat["w"].astype(np.intp)
        rate = t_true / t_true[default_gid[w_idx]]
        return cls(
            families=families,
            offset=offset,
            workload=w_idx,
            names=names,
            row=cat["row"].astype(np.intp),
            is_inference=cat["inf"].astype(bool),
            sm=cat["sm"],
            mem_mib=cat["mem"],
            dram=cat["dram"],
            t_catalog=cat["t"],
            t_true=t_true,
            rate=rate,
            default_gid=default_gid,
            gavel=tuple(gavel),
            params=cat["params"],
        )

    @property
    def size(self) -> int:
        return int(self.workload.size)

    def gid(self, workload: str, row: int) -> int:
        return self.offset[workload] + row

    def default_of(self, workload: str) -> int:
        return int(self.default_gid[self.names.index(workload)])

    def knobs(self, gid: int) -> dict[str, object]:
        name = self.names[int(self.workload[gid])]
        return dict(self.families[name].configs[int(self.row[gid])].as_dict())
