"""ElastiCo's exception tree.

Every error the package raises on purpose derives from :class:`ElasticoError`,
so a caller can catch one type at the edge (the HTTP service turns these into
4xx replies or an extender ``Error`` field; the CLI prints them)::

    ElasticoError
    ├── InvalidInputError          bad numbers or shapes handed to the core
    │   ├── InvalidProfileError    NaN / negative / inconsistent profile data
    │   └── InvalidSnapshotError   a snapshot that cannot be planned (duplicate ids, ...)
    ├── AnnotationError            invalid elastico.io/ pod annotations (carries every problem)
    ├── UnknownWorkloadError       a workload family with no profile and no catalog entry
    ├── ProfileStoreError          the SQLite profile store cannot be read or written
    ├── ClusterError               a write to the cluster (ConfigMap, annotations, Binding) failed
    │   └── NotLeader              a write this replica refused itself, not being the leader
    ├── RequestRefused             a service request refused with an HTTP status (agent
    │                              token, REST page), its message naming what to change
    ├── PredictorError             the interference model is missing, corrupt or got bad features
    ├── ProfilingError             a profiling run could not produce a profile
    ├── RingFormatError            the profiler shim's ring buffer is not in the expected layout
    └── ShimNotFoundError          the compiled LD_PRELOAD profiler library cannot be found
"""

from __future__ import annotations

__all__ = [
    "AnnotationError",
    "ClusterError",
    "ElasticoError",
    "InvalidInputError",
    "InvalidProfileError",
    "InvalidSnapshotError",
    "NotLeader",
    "PredictorError",
    "ProfileStoreError",
    "ProfilingError",
    "RequestRefused",
    "RingFormatError",
    "ShimNotFoundError",
    "UnknownWorkloadError",
]


class ElasticoError(Exception):
    """Base class of every error ElastiCo raises deliberately."""


class InvalidInputError(ElasticoError, ValueError):
    """Input numbers or shapes the core cannot work with."""


class InvalidProfileError(InvalidInputError):
    """A resource/performance profile holds NaN, negative or inconsistent values."""


class InvalidSnapshotError(InvalidInputError):
    """A cluster snapshot that cannot be planned (duplicate ids, unknown family, ...)."""


class AnnotationError(ElasticoError, ValueError):
    """One or more invalid ``elastico.io/`` annotations.

    ``problems`` holds every ``(annotation, message)`` pair, not only the first,
    so the pod's event tells the user everything to fix at once.
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(f"{key}: {msg}" for key, msg in self.problems))


class UnknownWorkloadError(ElasticoError, KeyError):
    """A workload family that has neither stored profiles nor a catalog entry."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want plain text
        return str(self.args[0]) if self.args else "unknown workload"


class ProfileStoreError(ElasticoError):
    """The profile store could not be opened, read or written."""


class PredictorError(ElasticoError):
    """The interference predictor is unusable (missing/corrupt model, bad features)."""


class ClusterError(ElasticoError):
    """A write to the cluster (ConfigMap, annotations, Binding) failed; the message says which.

    ``status`` is the API server's HTTP status when it answered (409: the pod is
    already bound; 404: it is gone), None when the outcome is unknown (timeout,
    connection lost): the write may have happened."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RequestRefused(ElasticoError):
    """A service request refused with an HTTP ``status`` (4xx, or 503: retry) and a
    ``message`` naming what to change; the REST layer answers with both."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class NotLeader(ClusterError):
    """A write this replica refused itself, not being the leader: the pod was neither bound
    nor changed (a bind stopped between its writes leaves only its ConfigMap: harmless)."""


class ProfilingError(ElasticoError):
    """The measurements cannot make a profile (no progress, empty window, ...)."""


class RingFormatError(ElasticoError, ValueError):
    """A file that is not a ring this decoder understands (magic, version, sizes)."""


class ShimNotFoundError(ElasticoError, FileNotFoundError):
    """The LD_PRELOAD profiler library is not built or not where it was said to be."""
