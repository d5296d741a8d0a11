"""Ground truth of the simulated cluster, kept apart from anything the planner sees.

The planner predicts slowdowns with whatever :class:`SlowdownPredictor` it was
given; the simulator charges the *true* slowdowns defined here.

True pairwise slowdown S(i|j) = T_i(solo) / T_i(next to j)
----------------------------------------------------------
1. **Measured pairs** (training + training): Gavel's measured single-GPU
   space-sharing pairs (CUDA MPS), V100 by default (closest to the A100 testbed),
   falling back to the P100 measurement where the V100 pair failed or was not
   run.  Catalog configurations map to Gavel job types as documented in
   :mod:`.workloads`.  Gavel did not vary checkpointing or AMP, so the measured
   excess is scaled by how much of the device the partner keeps busy relative
   to that partner's no-CK/no-AMP configuration at the same batch size::

       S(i|j) = 1 + (S_gavel(type_i, type_j) - 1) * sm_j(c_j) / sm_j(bs_j, no CK, no AMP)

   MPS overhead is already inside these measurements.
2. **Unmeasured pairs** (any pair with an inference job, or a training pair
   Gavel never measured): a contention model, documented and deliberately
   different from the planner's default predictor::

       S(i|j) = m_mps * (1 + k_sm * sm_j * min(1, sm_i + sm_j) + k_bw * dram_i * dram_j)

   with m_mps = 1.03 (MPS context-switch overhead), k_sm = 0.8 (time-sliced SM
   contention grows with the partner's share and with total SM demand),
   k_bw = 0.6 (DRAM bandwidth: LLM decode and recommendation are memory-bound).
   For a ResNet-50 + Qwen pair this gives ~1.6x for both, in the range of the
   spec's table "Representative co-location pairs" (retained 0.48-0.67 for
   severe/high pairs).

With more than two tenants on a device, excesses add:
``S_i = 1 + sum_j (S(i|j) - 1)``.  A gang (multi-GPU) job runs at the pace of
its slowest worker.

Reconfiguration costs (spec 5.7, "System Overhead")
---------------------------------------------------
* flag toggle (inference: only ``prefix_caching`` changes): 0 s;
* engine restart (inference: any other knob changes, or the engine moves):
  5 s + 10 s * size, size = (log10 params - 9) / (log10 8e9 - 9) clipped to [0, 1];
* checkpoint-resume (training: any knob change, a migration, or a resume after
  preemption): 15 s + 30 s * size, size on a log scale from 1e6 to 3.4e8 params.
The job holds its devices and makes no progress while it pays the cost.

Interference table file format (``--interference PATH``)
--------------------------------------------------------
CSV with a header; required columns ``job_a, job_b, slowdown_a, slowdown_b``;
optional ``gpu`` (rows are filtered to the requested GPU type, others used as
fall-back) and ``measured`` (1 or 0, true or false, empty for 1; 0 rows are
ignored, the trainer's rule: ``CsvRow.flag``).  A measured row's slowdowns
must be numbers in (0, 100] (below 1 reads as 1); a bad cell is an error naming
its line and column, a byte that is not UTF-8 one naming its line, a column named
twice in the header one naming the column.  ``job_a``/``job_b`` are
Gavel job types (``'ResNet-50 (batch size 64)'``) or catalog workload names
(``'qwen-1.7b'``, applying to every configuration of that workload).  Both
orders are filled from each row; rows that state a pair again on the same GPU type
must agree (a different slowdown is an error naming both lines; in a row pairing a
job with itself, ``slowdown_a`` counts).  Gavel's ``gavel_colocation_pairs.csv`` is in
this format; a trimmed copy (V100 and P100 rows) ships in ``sim/data``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from elastico_extender.csv_row import CsvRow, csv_header, csv_rows, open_csv
from elastico_extender.interference.lucid_tables import table_kind
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["DEFAULT_PAIRS", "GroundTruth", "load_pair_table"]

DEFAULT_PAIRS = Path(__file__).with_name("data") / "gavel_pairs_v100_p100.csv"
MPS_OVERHEAD = 1.03
K_SM = 0.8
K_BW = 0.6
MAX_PAIR_SLOWDOWN = 100.0
"""Largest slowdown a pair table may state: beyond it a pair is not co-location but a
stall, and a job that never progresses would keep a simulation running for ever."""


_LUCID_HINT = (
    "; this is one of Lucid's profile tables, whose jobs are not the simulator's workloads: "
    "they train the interference model (elastico train-iac --csv) and measure the online "
    "correction (benchmarks/online_transfer.py --pairs)"
)


def load_pair_table(path: Path | str, gpu: str = "v100") -> dict[tuple[str, str], float]:
    """{(victim name, partner name): slowdown} from a pair CSV (format in the module doc).

    Rows of ``gpu`` win; rows of other GPU types fill pairs ``gpu`` lacks.
    """
    primary: dict[tuple[str, str], float] = {}
    fallback: dict[tuple[str, str], float] = {}
    stated: dict[tuple[str, str, str], tuple[float, int]] = {}
    with open_csv(path) as handle:
        reader = csv.DictReader(handle)
        fields = csv_header(path, reader)
        missing = {"job_a", "job_b", "slowdown_a", "slowdown_b"} - set(fields)
        if missing:
            lucid = table_kind(fields) != "pairs"
            raise ValueError(
                f"{path}: missing columns {sorted(missing)}" + (_LUCID_HINT if lucid else "")
            )
        for row in csv_rows(path, reader):
            if not row.flag("measured", default=True):
                continue
            a, b = row.text("job_a"), row.text("job_b")
            for column, name in (("job_a", a), ("job_b", b)):
                if not name:
                    raise row.fail(column, "missing")
            s_a = row.number("slowdown_a", 0.0, MAX_PAIR_SLOWDOWN, above_low=True)
            s_b = row.number("slowdown_b", 0.0, MAX_PAIR_SLOWDOWN, above_low=True)
            row_gpu = row.text("gpu") or gpu
            target = primary if row_gpu == gpu else fallback
            for column, victim, partner, slowdown in (
                ("slowdown_a", a, b, max(s_a, 1.0)),
                ("slowdown_b", b, a, max(s_b, 1.0)),
            ):
                _check_agrees(stated, row, column, (row_gpu, victim, partner), slowdown)
                target.setdefault((victim, partner), slowdown)
    return {**fallback, **primary}


def _check_agrees(
    stated: dict[tuple[str, str, str], tuple[float, int]],
    row: CsvRow,
    column: str,
    key: tuple[str, str, str],
    slowdown: float,
) -> None:
    """Record ``key``'s (gpu, victim, partner) slowdown; one an earlier row states
    differently is an error naming both lines (which to believe would be a guess).  A
    pair of a job with itself states its slowdown twice in one row: the first counts."""
    earlier, line = stated.setdefault(key, (slowdown, row.line))
    if earlier != slowdown and line != row.line:
        gpu, victim, partner = key
        raise row.fail(
            column,
            f"{victim} next to {partner} on {gpu} is {earlier:g} on line {line} "
            "(rows of one pair must agree)",
        )


@dataclass(eq=False)
class GroundTruth:
    """True slowdown matrix over configuration ids and the reconfiguration cost model."""

    configs: ConfigTable
    slowdown: np.ndarray  # (C, C) S(victim gid | partner gid), MPS included
    measured: np.ndarray  # (C, C) bool: from a measured pair

    @classmethod
    def build(
        cls,
        configs: ConfigTable,
        pairs: Path | str | None = DEFAULT_PAIRS,
        gpu: str = "v100",
    ) -> GroundTruth:
        c = configs
        sm_i, sm_j = c.sm[:, None], c.sm[None, :]
        model = MPS_OVERHEAD * (
            1.0
            + K_SM * sm_j * np.minimum(1.0, sm_i + sm_j)
            + K_BW * c.dram[:, None] * c.dram[None, :]
        )
        slowdown = model.copy()
        measured = np.zeros_like(slowdown, dtype=bool)
        if pairs is not None:
            table = load_pair_table(pairs, gpu)
            # Partner SM relative to its no-CK/no-AMP configuration at the same batch size.
            rel = np.ones(c.size)
            for name, fam in c.families.items():
                if "batch_size" not in fam.configs[0].as_dict():
                    continue
                base: dict[int, float] = {}
                for r, cfg in enumerate(fam.configs):
                    if not cfg["checkpointing"] and not cfg["amp"]:
                        base[int(cfg["batch_size"])] = float(fam.resources[r, 0])
                for r, cfg in enumerate(fam.configs):
                    g = c.offset[name] + r
                    rel[g] = float(fam.resources[r, 0]) / base[int(cfg["batch_size"])]
            keys = [c.gavel[g] or c.names[int(c.workload[g])] for g in range(c.size)]
            names = [c.names[int(c.workload[g])] for g in range(c.size)]
            uniq = sorted(set(keys) | set(names))
            pos = {k: i for i, k in enumerate(uniq)}
            dense = np.full((len(uniq), len(uniq)), np.nan)
            for (a, b), s in table.items():
                if a in pos and b in pos:
                    dense[pos[a], pos[b]] = s
            ki = np.array([pos[k] for k in keys])
            ni = np.array([pos[n] for n in names])
            gathered = dense[ki[:, None], ki[None, :]]
            by_name = dense[ni[:, None], ni[None, :]]
            gathered = np.where(np.isnan(gathered), by_name, gathered)
            have = ~np.isnan(gathered)
            scaled = 1.0 + (np.nan_to_num(gathered, nan=1.0) - 1.0) * rel[None, :]
            slowdown = np.where(have, scaled, model)
            measured = have
        np.maximum(slowdown, 1.0, out=slowdown)
        return cls(configs=configs, slowdown=slowdown, measured=measured)

    def scaled(self, factor: float) -> GroundTruth:
        """The same cluster with every true excess slowdown times ``factor``.

        ``S'(i|j) = 1 + factor * (S(i|j) - 1)``: 0 is co-location without any
        interference (a what-if ceiling), 1 the measured truth.
        """
        if factor < 0:
            raise ValueError(f"interference factor must be >= 0, got {factor}")
        return replace(self, slowdown=1.0 + factor * (self.slowdown - 1.0))

    # -- slowdowns ----------------------------------------------------------------
    def pair_slowdowns(
        self, gids: np.ndarray, jobs: np.ndarray | None = None, t: float = 0.0
    ) -> np.ndarray:
        """S(i|j) at time ``t`` between the tenants of one device (row i, column j).

        ``jobs`` (trace rows) and ``t`` matter only in worlds whose jobs vary over time
        (:mod:`.production`); here every job saturates its GPU at all times.
        """
        return self.slowdown[gids[:, None], gids[None, :]]

    def device_slowdowns(
        self, gids: np.ndarray, jobs: np.ndarray | None = None, t: float = 0.0
    ) -> np.ndarray:
        """S of every tenant of one device: 1 + sum over partners of (S(i|j) - 1)."""
        if gids.size < 2:
            return np.ones(gids.size)
        block = self.pair_slowdowns(gids, jobs, t) - 1.0
        np.fill_diagonal(block, 0.0)
        return 1.0 + block.sum(axis=1)

    def next_change(self, t: float) -> float:
        """When job activities next change (never: benchmark jobs always saturate)."""
        return math.inf

    # -- reconfiguration costs ------------------------------------------------------
    def _size(self, gid: int) -> float:
        c = self.configs
        p = max(float(c.params[gid]), 1.0)
        if c.is_inference[gid]:
            return min(max((math.log10(p) - 9.0) / (math.log10(8e9) - 9.0), 0.0), 1.0)
        return min(max((math.log10(p) - 6.0) / (math.log10(3.4e8) - 6.0), 0.0), 1.0)

    def restart_cost(self, gid: int) -> float:
        """Seconds to bring the job back after a move or preemption (same configuration)."""
        if self.configs.is_inference[gid]:
            return 5.0 + 10.0 * self._size(gid)
        return 15.0 + 30.0 * self._size(gid)

    def reconfig_cost(self, old: int, new: int) -> float:
        """Seconds of no progress for an in-place switch ``old -> new`` (spec 5.7)."""
        if old == new:
            return 0.0
        c = self.configs
        if c.is_inference[new]:
            a, b = c.knobs(old), c.knobs(new)
            changed = {k for k in a if a[k] != b.get(k)}
            if changed <= {"prefix_caching"}:
                return 0.0  # flag toggle over the side channel
            return 5.0 + 10.0 * self._size(new)
        return 15.0 + 30.0 * self._size(new)

    def summary(self) -> dict[str, float]:
        """Distribution facts of the true slowdowns over default configurations."""
        d = self.configs.default_gid
        block = self.slowdown[d[:, None], d[None, :]]
        meas = self.measured[d[:, None], d[None, :]]
        return {
            "median_all_defaults": float(np.median(block)),
            "median_measured_defaults": float(np.median(block[meas])) if meas.any() else 1.0,
            "share_measured_pairs": float(self.measured.mean()),
        }
