"""Profile families by name: the built-in catalog, overridden by measured profiles.

One family per workload name (a core :class:`Snapshot` keys families by name),
built for the service's reference GPU; measured rows in the profile store for
that hardware take precedence (``ProfileStore.family``).  Pods that request GPUs
without opting in are modelled by :data:`EXCLUSIVE`: one whole device each.

Unknown workloads (issue 11, Learn; spec 4.1): a pod that names a family the
catalog does not have *and* declares its kind (``elastico.io/kind``) gets an
*unprofiled* family (:meth:`FamilyResolver.unprofiled`): one configuration,
``as-is``, flagged estimated, demanding a whole device (all SMs and all
memory), so it runs alone; its IAC features are a typical catalog workload's
of its kind (column medians) with a whole device's SM activity and memory, and
a ``log10_params`` nudged by its name (``features.unknown_family_log10_params``):
two unprofiled workloads are two families to the online correction, also
where their measured rows read alike, and also where a stored row was
written before the nudge.
When the node agent reports a solo window of it (peak memory and SM
activity), the observation owner writes that window as the family's measured
profile (``profiles/observed.record_solo_profile``) and the engine drops what
it built from the old family (``Engine.forget_family``); the family is then
built again with the measured row, and the pod may share.  Without
``elastico.io/kind`` an unknown name stays an annotation error (a typo is
reported, not run).

The cache is bounded (``FAMILY_CACHE`` names, least recently used dropped;
a dropped family is simply built again).
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from dataclasses import replace

import numpy as np

from elastico_extender.core.interference.features import (
    FB,
    NUM_JOB_FEATURES,
    PARAMS,
    SM,
    unknown_family_log10_params,
)
from elastico_extender.core.model import Configuration, JobKind, ProfileFamily
from elastico_extender.core.shapes.catalog import CATALOG, build_family
from elastico_extender.errors import ProfileStoreError, UnknownWorkloadError
from elastico_extender.profiles.store import ProfileStore

__all__ = ["EXCLUSIVE", "EXCLUSIVE_FAMILY", "FAMILY_CACHE", "UNPROFILED", "FamilyResolver"]

log = logging.getLogger(__name__)

FAMILY_CACHE = 4096
"""Families kept built (catalog ones plus unprofiled names in use)."""
UNPROFILED = Configuration((("as-is", True),))
"""The one configuration of an unprofiled workload: the pod as its user wrote it."""
UNPROFILED_UNIT = "unprofiled"
"""Throughput unit of an unprofiled family: no rate an agent reports is in it, so T(c)
stays 1 (a launch rate is no throughput; the slowdown is measured against the pod's own
solo rate by the observation book)."""
_NAME = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")

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
        self._cache: OrderedDict[str, ProfileFamily] = OrderedDict()
        self._lock = threading.Lock()
        # Counts forgets: a build that one overtook (read the store before a measured
        # profile was written) is answered once and not cached.
        self._forgets = 0

    def __call__(self, name: str) -> ProfileFamily:
        """The catalog family ``name`` with measured rows; UnknownWorkloadError if none."""
        if name == EXCLUSIVE:
            raise UnknownWorkloadError(f"{EXCLUSIVE!r} is reserved")
        cached = self._cached(name)
        if cached is not None and cached.throughput_unit != UNPROFILED_UNIT:
            return cached
        return self._build(name, build_family(name, self.device_mib, self.hardware))

    def unprofiled(self, name: str, kind: JobKind) -> ProfileFamily:
        """The family of workload ``name`` that the catalog lacks (module doc): measured
        rows from the profile store when its solo window was seen, else a whole device."""
        if name == EXCLUSIVE or name in CATALOG or not _NAME.match(name):
            raise UnknownWorkloadError(
                f"{name!r} cannot name an unprofiled workload (lower-case letters, digits, "
                "'.', '_', '-'; at most 63; not a catalog or reserved name)"
            )
        cached = self._cached(name)
        if cached is not None and cached.kind is kind:
            return cached
        features = self._typical_features(kind)
        features[0, SM] = 1.0  # a whole device until measured
        features[0, FB] = self.device_mib / 1024.0
        features[0, PARAMS] = unknown_family_log10_params(name, float(features[0, PARAMS]))
        base = ProfileFamily(
            workload=name,
            kind=kind,
            configs=(UNPROFILED,),
            resources=np.array([[1.0, self.device_mib, 0.0, 0.0]]),
            throughput=np.ones(1),
            features=features,
            estimated=np.ones(1, dtype=bool),
            hardware=self.hardware,
            throughput_unit=UNPROFILED_UNIT,
        )
        return self._build(name, base, keep_params=True)

    def _typical_features(self, kind: JobKind) -> np.ndarray:
        """The IAC job block of a typical catalog workload of ``kind`` (column medians of
        each family's fastest row): the prior of an unprofiled workload's features, whose
        SM activity and memory its solo window then replaces."""
        built = (build_family(name, self.device_mib, self.hardware) for name in sorted(CATALOG))
        rows = [f for f in built if f.kind is kind]
        block = np.median([f.features[f.fastest_index] for f in rows], axis=0)
        return np.asarray(block, dtype=np.float32).reshape(1, NUM_JOB_FEATURES)

    def forget(self, name: str) -> None:
        """Drop ``name``'s built family (its profile changed): the next call rebuilds it."""
        with self._lock:
            self._cache.pop(name, None)
            self._forgets += 1

    def known(self) -> dict[str, ProfileFamily]:
        with self._lock:
            return {EXCLUSIVE: EXCLUSIVE_FAMILY, **self._cache}

    def _cached(self, name: str) -> ProfileFamily | None:
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None:
                self._cache.move_to_end(name)
            return cached

    def _build(self, name: str, base: ProfileFamily, keep_params: bool = False) -> ProfileFamily:
        """``base`` with the store's measured rows; with ``keep_params`` every row keeps
        the base's log10_params (an unprofiled family's identity: a row stored before the
        nudge cannot take it back)."""
        with self._lock:
            forgets = self._forgets
        try:
            family = base if self.store is None else self.store.family(base, self.hardware)
        except ProfileStoreError as exc:  # the catalog's rows this time; not cached
            log.warning("families.store_unreadable", extra={"family": name, "error": str(exc)})
            return base
        params = base.features[0, PARAMS]
        if keep_params and (family.features[:, PARAMS] != params).any():
            features = family.features.copy()
            features[:, PARAMS] = params
            family = replace(family, features=features)
        with self._lock:
            if self._forgets != forgets:
                return family
            self._cache[name] = family
            while len(self._cache) > FAMILY_CACHE:
                self._cache.popitem(last=False)
        return family
