"""What the service needs from a cluster: a live view and a way to bind.

Two implementations: :class:`~.kube.KubeCluster` (the API server through the
official client) and :class:`~.embedded.EmbeddedCluster` (a file of real
Node/Pod objects, the no-cluster default and the test fixture).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from elastico_extender.cluster.state import ClusterState
from elastico_extender.errors import ClusterError

__all__ = ["BindRequest", "Cluster", "ClusterError", "ConfigMapReader"]


@dataclass(frozen=True)
class BindRequest:
    """Everything bind writes, in order: ConfigMap, pod annotations, Binding.

    ``configmap`` is None for pods that did not opt in (they are bound untouched).
    """

    namespace: str
    name: str
    uid: str
    node: str
    annotations: dict[str, str] = field(default_factory=dict)
    configmap: str | None = None
    data: dict[str, str] = field(default_factory=dict)


@runtime_checkable
class Cluster(Protocol):
    """Contract: ``state`` is kept current by the implementation once ``start`` returns
    (it may still be syncing: see ``state.is_synced``); ``bind`` performs the writes of
    a :class:`BindRequest` and raises :class:`ClusterError` on failure (``reconfigure``
    the same writes without the Binding, for a pod already bound); ``stop`` ends
    every background thread it started.  ``description`` is one line for logs."""

    state: ClusterState
    description: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def bind(self, request: BindRequest) -> None: ...

    def reconfigure(self, request: BindRequest) -> None:
        """Rewrite a bound pod's ConfigMap and decision annotations (no Binding): the
        runtime reconfiguration path (spec 4.2); ``elastico-run`` sees the new
        annotations through its downward-API file and restarts the workload."""
        ...

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """Evict the pod through the Eviction API (its controller recreates it; a
        PodDisruptionBudget may refuse: ClusterError).  Only a pod with ``uid``."""
        ...


@runtime_checkable
class ConfigMapReader(Protocol):
    """A cluster that can read back a pod's ConfigMap: bind writes the decision there as
    well as on the pod's annotations, and the ConfigMap is what a restarted extender
    still finds when a user removed the annotations (``service.recovery``)."""

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap object, None when there is none of that name; ClusterError when
        the API server cannot answer (the caller tries again later)."""
        ...
