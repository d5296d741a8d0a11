"""Profile families by name: the built-in catalog, overridden by measured profiles.

One family per workload name (a core :class:`Snapshot` keys families by name),
built for the service's reference GPU; measured rows in the profile store for
that hardware take precedence (``ProfileStore.family``).  Pods that request GPUs
without opting in are modelled by :data:`EXCLUSIVE`: one whole device each.
"""

from __future__ import annotations

import threading

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES
from elastico_extender.core.model import Configuration, JobKind, ProfileFamily
from elastico_extender.core.shapes.catalog import build_family
from elastico_extender.profiles.store import ProfileStore

__all__ = ["EXCLUSIVE", "EXCLUSIVE_FAMILY", "FamilyResolver"]

EXCLUSIVE = "elastico.exclusive-gpu"
"""Reserved family name of GPU pods that did not opt in."""

EXCLUSIVE_FAMILY = ProfileFamily(
    workload=EXCLUSIVE,
    kind=JobKind.TRAINING,
    configs=(Configuration((("exclusive", True),)),),
    # The whole SM share: nothing else fits next to it; no memory term so it fits any GPU.
    resources=np.array([[1.0, 0.0, 0.0, 0.0]]),
    throughput=np.array([1.0]),
    features=np.zeros((1, NUM_JOB_FEATURES), dtype=np.float32),
    hardware="any",
    throughput_unit="pods",
)


class FamilyResolver:
    """Callable ``name -> ProfileFamily`` with a cache; raises UnknownWorkloadError."""

    def __init__(
        self,
        device_mib: float,
        hardware: str = "A100-SXM4-40GB",
        store: ProfileStore | None = None,
    ) -> None:
        self.device_mib = device_mib
        self.hardware = hardware
        self.store = store
        self._cache: dict[str, ProfileFamily] = {EXCLUSIVE: EXCLUSIVE_FAMILY}
        self._lock = threading.Lock()

    def __call__(self, name: str) -> ProfileFamily:
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and name != EXCLUSIVE:
            return cached
        if name == EXCLUSIVE:
            from elastico_extender.errors import UnknownWorkloadError

            raise UnknownWorkloadError(f"{EXCLUSIVE!r} is reserved")
        family = build_family(name, self.device_mib, self.hardware)
        if self.store is not None:
            family = self.store.family(family, self.hardware)
        with self._lock:
            self._cache[name] = family
        return family

    def known(self) -> dict[str, ProfileFamily]:
        with self._lock:
            return dict(self._cache)
