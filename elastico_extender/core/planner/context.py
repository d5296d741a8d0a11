"""What the packing passes (running jobs, squeeze) need from the epoch that runs them.

The epoch (``epoch._Epoch``) owns the per-epoch tables and caches; passes
that live in their own modules reach them through this protocol, so each
pass states exactly what it uses and no module imports the epoch itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from elastico_extender.core.model import Snapshot
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.planner.tables import JobTables

__all__ = ["EpochRows"]


class EpochRows(Protocol):
    snapshot: Snapshot
    t: JobTables

    def tolerance(self, rows: np.ndarray, configs: np.ndarray) -> np.ndarray:
        """tau of each (row, configuration) pair."""
        ...

    def tolerance_rows(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), K) tau at every configuration, cached per row."""
        ...

    def try_row(
        self,
        placer: Placer,
        row: int,
        options: list[int],
        allowed_devices: np.ndarray | None = None,
        tolerance: np.ndarray | None = None,
    ) -> bool:
        """Place ``row`` in the first of ``options`` that fits safely (anywhere allowed)."""
        ...

    def open_devices(self, row: int) -> np.ndarray | None:
        """(G,) devices not on a node barred to ``row`` (``Job.barred_nodes``); None: all."""
        ...

    def commit_row(self, placer: Placer, row: int, config: int, devices: Sequence[int]) -> None:
        """Commit ``row`` at ``config`` on ``devices`` (known to fit)."""
        ...

    def reconfigure(self, placer: Placer, row: int, config: int) -> None:
        """Switch a placed single-GPU row to ``config`` on the same device."""
        ...
