"""IAC feature vector (spec 3.3.1): 14 per job + 14 for its partner + 8 pairwise = 36.

One documented order, shared by offline training and online serving.  The
first 14 columns always describe the job whose slowdown is predicted (the
"victim"), the next 14 its partner, so each measured pair yields two rows
with the blocks swapped.

Per-job block (index: name, unit)::

     0 sm_active           fraction of cycles with >= 1 active warp (0..1)
     1 sm_occupancy        resident / max warps per SM (0..1)
     2 dram_active         fraction of cycles with DRAM traffic (0..1)
     3 fb_used_gib         device memory used, GiB
     4 tensor_active       fraction of cycles with tensor-core work (0..1)
     5 is_inference        0 training, 1 offline inference
     6 log10_params        log10 of the model's parameter count
     7 log10_throughput    log10 of isolated throughput T(c) (its own unit)
     8 micro_batch_log2    training: log2(micro-batch); inference: 0
     9 checkpointing       training: 0/1
    10 amp                 training: 0/1
    11 input_len_k         inference: mean input length, thousands of tokens
    12 output_len_k        inference: mean output length, thousands of tokens
    13 prefix_ratio        inference: share of prompt tokens served from the prefix cache

Pairwise block (28..35)::

    28..31  mean of sm_active, sm_occupancy, dram_active, tensor_active
    32      co-location type: 0 training+training, 1 training+inference, 2 inference+inference
    33      memory pressure: (fb_i + fb_j) / device memory
    34      compute balance: min(sm_i, sm_j) / max(sm_i, sm_j)
    35      memory-intensity difference: |dram_i/sm_i - dram_j/sm_j|

The spec lists "the mean of each hardware metric" among 8 pairwise terms; with
5 metrics that would make 9, so framebuffer is left out of the means (it is
already in the memory-pressure term) to keep the stated 36 dimensions.
Logs and thousands keep every column within a few units of zero so one
BatchNorm'd network serves all of them.

A family whose parameter count nobody gave (a user's own workload, a pair
table's unknown model) gets a typical ``log10_params`` nudged by a fixed
per-name amount (:func:`unknown_family_log10_params`, at most
``UNKNOWN_PARAMS_SPREAD`` decade either way).  The prior stays typical for the
network, and the column still tells families apart: the online correction
keys family pairs on ``is_inference`` and ``log10_params`` and configuration
pairs on both job blocks, so with one shared value every unknown family would
pass for one family, and two of its configurations could pass for one pair.
"""

from __future__ import annotations

import hashlib

import numpy as np

__all__ = [
    "FEATURE_NAMES",
    "JOB_FEATURES",
    "NUM_FEATURES",
    "NUM_JOB_FEATURES",
    "PAIR_FEATURES",
    "UNKNOWN_PARAMS_SPREAD",
    "job_features",
    "pair_features",
    "unknown_family_log10_params",
]

JOB_FEATURES: tuple[str, ...] = (
    "sm_active",
    "sm_occupancy",
    "dram_active",
    "fb_used_gib",
    "tensor_active",
    "is_inference",
    "log10_params",
    "log10_throughput",
    "micro_batch_log2",
    "checkpointing",
    "amp",
    "input_len_k",
    "output_len_k",
    "prefix_ratio",
)
PAIR_FEATURES: tuple[str, ...] = (
    "mean_sm_active",
    "mean_sm_occupancy",
    "mean_dram_active",
    "mean_tensor_active",
    "colocation_type",
    "memory_pressure",
    "compute_balance",
    "memory_intensity_diff",
)
FEATURE_NAMES: tuple[str, ...] = (
    tuple(f"self_{n}" for n in JOB_FEATURES)
    + tuple(f"partner_{n}" for n in JOB_FEATURES)
    + PAIR_FEATURES
)
NUM_JOB_FEATURES = len(JOB_FEATURES)
NUM_FEATURES = len(FEATURE_NAMES)
assert NUM_JOB_FEATURES == 14 and NUM_FEATURES == 36

SM, OCC, DRAM, FB, TENSOR, IS_INF, PARAMS = 0, 1, 2, 3, 4, 5, 6
_EPS = 1e-6
UNKNOWN_PARAMS_SPREAD = 0.02
"""Largest nudge (decades, about 5%) of an unknown family's typical log10_params: the
shipped model's answers move by at most about 2% (next to every catalog configuration;
a window's 3% error is larger), and 40,000 to 80,000 float32 values lie within it, so
two names rarely meet."""


def unknown_family_log10_params(name: str, typical: float) -> float:
    """``log10_params`` of family ``name`` whose parameter count is unknown (module doc):
    ``typical`` plus a nudge in [-UNKNOWN_PARAMS_SPREAD, UNKNOWN_PARAMS_SPREAD] fixed by
    the name (a stable hash, so a restart or another process gives the same value)."""
    digest = hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest()
    unit = int.from_bytes(digest, "big") / 2.0**64  # [0, 1)
    return typical + (2.0 * unit - 1.0) * UNKNOWN_PARAMS_SPREAD


def job_features(
    *,
    hardware: np.ndarray,
    is_inference: bool,
    param_count: float,
    throughput: np.ndarray,
    batch_size: np.ndarray | None = None,
    checkpointing: np.ndarray | None = None,
    amp: np.ndarray | None = None,
    input_len: np.ndarray | None = None,
    output_len: np.ndarray | None = None,
    prefix_ratio: np.ndarray | None = None,
) -> np.ndarray:
    """Per-job blocks for K configurations at once.

    ``hardware`` is (K, 5): sm_active, sm_occupancy, dram_active, fb_used_gib,
    tensor_active.  Knob arrays are (K,) and default to zeros (the knobs of the
    other workload type).
    """
    hw = np.asarray(hardware, dtype=np.float64)
    k = hw.shape[0]
    out = np.zeros((k, NUM_JOB_FEATURES), dtype=np.float32)
    out[:, :5] = hw
    out[:, IS_INF] = 1.0 if is_inference else 0.0
    out[:, 6] = np.log10(max(param_count, 1.0))
    out[:, 7] = np.log10(np.maximum(np.asarray(throughput, dtype=np.float64), _EPS))

    def col(values: np.ndarray | None) -> np.ndarray:
        return np.zeros(k) if values is None else np.asarray(values, dtype=np.float64)

    batch = col(batch_size)
    out[:, 8] = np.where(batch > 0, np.log2(np.maximum(batch, 1.0)), 0.0)
    out[:, 9] = col(checkpointing)
    out[:, 10] = col(amp)
    out[:, 11] = col(input_len) / 1000.0
    out[:, 12] = col(output_len) / 1000.0
    out[:, 13] = col(prefix_ratio)
    return out


def pair_features(
    victim: np.ndarray, partner: np.ndarray, device_memory_gib: np.ndarray | float
) -> np.ndarray:
    """Stack (P, 14) victim blocks and (P, 14) partner blocks into (P, 36) rows."""
    a = np.asarray(victim, dtype=np.float32)
    b = np.asarray(partner, dtype=np.float32)
    memory = np.broadcast_to(np.asarray(device_memory_gib, dtype=np.float32), (a.shape[0],))
    out = np.empty((a.shape[0], NUM_FEATURES), dtype=np.float32)
    out[:, :14] = a
    out[:, 14:28] = b
    for column, metric in enumerate((SM, OCC, DRAM, TENSOR)):
        out[:, 28 + column] = 0.5 * (a[:, metric] + b[:, metric])
    out[:, 32] = a[:, IS_INF] + b[:, IS_INF]
    out[:, 33] = (a[:, FB] + b[:, FB]) / np.maximum(memory, _EPS)
    sm_a, sm_b = a[:, SM], b[:, SM]
    out[:, 34] = np.minimum(sm_a, sm_b) / np.maximum(np.maximum(sm_a, sm_b), _EPS)
    out[:, 35] = np.abs(a[:, DRAM] / np.maximum(sm_a, _EPS) - b[:, DRAM] / np.maximum(sm_b, _EPS))
    return out
