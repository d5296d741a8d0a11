"""Where a bound pod runs when its decision annotations are gone: read back from its ConfigMap.

Bind writes the decision twice, in order: the pod's ConfigMap (owned by the pod; the
webhook wired its keys into the container's environment, so ``ELASTICO_GPU_INDICES``
there is the GPU the container was given) and the decision annotations on the pod.
A user can remove the annotations (``kubectl annotate pod ... elastico.io/assigned-devices-``);
the container keeps running where bind put it.  The snapshot builder remembers the last
placement it read in memory, which a restarted extender does not have: it then asks
:class:`PlacementRecovery`, which reads the ConfigMap back (one GET per such pod, answers
kept while the pod is asked about) and checks that it is this pod's (its owner
reference names the pod's UID), so the API server stays the only store.

The ConfigMap's name, first found first: the webhook's ``elastico.io/configmap``
annotation, the ``configMapKeyRef`` of the pod's ``ELASTICO_GPU_INDICES`` env (the
webhook's, immutable in the pod spec: still there when every annotation went), or the
name bind gives a pod the webhook did not see (``elastico-<pod name>``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, NamedTuple

from elastico_extender.annotations import PREFIX, configmap_name, device_indices
from elastico_extender.cluster.base import ConfigMapReader
from elastico_extender.core.handoff import knob_variable
from elastico_extender.errors import ClusterError

__all__ = [
    "CONFIGURATION_KEY",
    "GPU_INDICES_KEY",
    "MAX_READS_PER_BUILD",
    "PlacementRecovery",
    "Recovered",
    "configmap_of",
    "placement_from",
]

log = logging.getLogger(__name__)

GPU_INDICES_KEY = knob_variable("GPU_INDICES")
"""The ConfigMap key holding the host GPU indices bind chose (``core.handoff``)."""
CONFIGURATION_KEY = knob_variable("CONFIGURATION")
"""The ConfigMap key holding the label of the configuration bind chose."""
MAX_READS_PER_BUILD = 16
"""ConfigMaps read per snapshot at most: after a restart with many stripped pods the
first epochs catch up a few at a time instead of one epoch waiting on hundreds of reads
(a pod not read yet is counted on free devices, as before, until its turn)."""


class Recovered(NamedTuple):
    """A bound pod's placement as its ConfigMap records it."""

    devices: tuple[int, ...]
    configuration: str  # the configuration's label ('' when absent)


def configmap_of(pod: Mapping[str, Any]) -> str:
    """The name of the pod's ConfigMap (module docstring: annotation, env, default)."""
    meta = pod.get("metadata") or {}
    named = (meta.get("annotations") or {}).get(PREFIX + "configmap")
    if isinstance(named, str) and named:
        return named
    spec = pod.get("spec") or {}
    for container in spec.get("containers") or ():
        for entry in (container.get("env") or ()) if isinstance(container, dict) else ():
            if not isinstance(entry, dict) or entry.get("name") != GPU_INDICES_KEY:
                continue
            source = entry.get("valueFrom")
            ref = source.get("configMapKeyRef") if isinstance(source, dict) else None
            name = ref.get("name") if isinstance(ref, dict) else None
            if isinstance(name, str) and name:
                return name
    return configmap_name(meta)  # the name bind gives a pod the webhook did not see


def placement_from(pod: Mapping[str, Any], configmap: Mapping[str, Any] | None) -> Recovered | None:
    """The placement ``configmap`` records for ``pod``; None when there is none, when the
    ConfigMap is not this pod's (no owner reference with its UID: another pod's of the
    same name, or one a user wrote) or when its GPU indices are unreadable."""
    if not configmap:
        return None
    uid = (pod.get("metadata") or {}).get("uid")
    owners = (configmap.get("metadata") or {}).get("ownerReferences") or ()
    if not uid or not any(isinstance(o, dict) and o.get("uid") == uid for o in owners):
        return None
    data = configmap.get("data") or {}
    indices = data.get(GPU_INDICES_KEY) if isinstance(data, dict) else None
    if not isinstance(indices, str):
        return None
    devices = device_indices(indices)
    if not devices:
        return None
    label = data.get(CONFIGURATION_KEY)
    return Recovered(devices, label if isinstance(label, str) else "")


class PlacementRecovery:
    """Reads bound pods' placements back from their ConfigMaps, once per pod.

    Used by one snapshot build at a time (the epoch): :meth:`begin`, then
    :meth:`placement` per pod that needs it, then :meth:`end`, which forgets the pods
    that were not asked about (gone, or their placement known again), so what it keeps
    is bounded by the cluster's pods.  A read the API server could not answer is not
    remembered: it is tried again at the next build."""

    def __init__(self, reader: ConfigMapReader, max_reads: int = MAX_READS_PER_BUILD) -> None:
        self.reader = reader
        self.max_reads = max_reads
        self._answers: dict[str, Recovered | None] = {}
        self._asked: set[str] = set()
        self._reads = 0

    def begin(self) -> None:
        self._asked = set()
        self._reads = 0

    def placement(self, uid: str, pod: Mapping[str, Any]) -> Recovered | None:
        """The pod's placement from its ConfigMap (None: none readable, or not read yet)."""
        self._asked.add(uid)
        if uid in self._answers:
            return self._answers[uid]
        if self._reads >= self.max_reads:
            return None  # its turn comes at a later build
        self._reads += 1
        meta = pod.get("metadata") or {}
        namespace, name = str(meta.get("namespace") or "default"), configmap_of(pod)
        try:
            found = placement_from(pod, self.reader.read_configmap(namespace, name))
        except ClusterError as exc:
            log.warning(
                "placement.unread",
                extra={"pod": f"{namespace}/{meta.get('name', '')}", "configmap": name,
                       "error": str(exc)},
            )  # fmt: skip
            return None
        self._answers[uid] = found
        log.info(
            "placement.recovered" if found is not None else "placement.unknown",
            extra={"pod": f"{namespace}/{meta.get('name', '')}", "configmap": name,
                   "devices": list(found.devices) if found is not None else None},
        )  # fmt: skip
        return found

    def end(self) -> None:
        self._answers = {uid: a for uid, a in self._answers.items() if uid in self._asked}
