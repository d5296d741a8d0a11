"""Immutable records the core plans over: the snapshot in, the plan out.

The core never reads Kubernetes objects, files or the clock.  A driver (the
extender service or the simulator) translates its world into a
:class:`Snapshot`, calls :func:`elastico_extender.core.planner.plan`, and
applies the returned :class:`Plan`.  Everything here is frozen so a published
plan can be read from many threads without locks.
"""

from __future__ import annotations

import math
from array import array as typed_array
from collections.abc import ItemsView, Iterator, Mapping, ValuesView
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from itertools import chain, repeat
from typing import NamedTuple

import numpy as np

from elastico_extender.core.observations import ObservedSlowdown
from elastico_extender.core.resources import NUM_RESOURCES, RESOURCE_NAMES
from elastico_extender.errors import InvalidProfileError, InvalidSnapshotError

__all__ = [
    "Action",
    "Assignment",
    "AssignmentColumns",
    "Configuration",
    "DeviceIndex",
    "DeviceRef",
    "GpuDevice",
    "Job",
    "JobColumns",
    "JobKind",
    "KnobValue",
    "MeasuredRates",
    "Mode",
    "Node",
    "Plan",
    "PlanRows",
    "ProfileFamily",
    "Snapshot",
    "device_index",
]

KnobValue = int | float | bool | str
DeviceRef = tuple[str, int]
"""``(node name, GPU index on that node)``: one physical device."""


class JobKind(StrEnum):
    """The two workload classes of spec 3.1, tuned through different knobs."""

    TRAINING = "training"
    INFERENCE = "inference"


class Mode(StrEnum):
    """``elastic``: the scheduler may pick any allowed configuration (RST).
    ``fixed``: the job keeps the configuration it asked for; it may still share a GPU."""

    ELASTIC = "elastic"
    FIXED = "fixed"


class Action(StrEnum):
    """What the driver must do for a job to follow the plan (spec 3.4, runtime adaptation)."""

    KEEP = "keep"  # nothing changes
    RECONFIGURE = "reconfigure"  # same devices, new configuration (in place; preferred)
    MIGRATE = "migrate"  # new devices (with or without a new configuration)
    ADMIT = "admit"  # a pending job starts
    PREEMPT = "preempt"  # a running job could not be kept (documented last resort)


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU: its index on the node and its memory in MiB."""

    index: int
    memory_mib: float
    product: str = "unknown"


@dataclass(frozen=True, slots=True)
class Node:
    """A node with its GPU devices and the host resources left for GPU jobs."""

    name: str
    gpus: tuple[GpuDevice, ...]
    cpu_cores: float = 64.0
    host_mem_mib: float = 512.0 * 1024

    @property
    def hardware_signature(self) -> str:
        """Products of this node's GPUs, the key under which profiles are valid."""
        return ",".join(sorted({g.product for g in self.gpus})) or "none"


@dataclass(frozen=True)
class Configuration:
    """One point of a job's knob space, e.g. ``batch_size=64, checkpointing=True, amp=False``.

    No ``__slots__``: :attr:`label` is computed once and kept on the instance (the REST
    views show one per job on every read)."""

    knobs: tuple[tuple[str, KnobValue], ...]

    def __getitem__(self, name: str) -> KnobValue:
        for key, value in self.knobs:
            if key == name:
                return value
        raise KeyError(name)

    def get(self, name: str, default: KnobValue | None = None) -> KnobValue | None:
        try:
            return self[name]
        except KeyError:
            return default

    def as_dict(self) -> dict[str, KnobValue]:
        return dict(self.knobs)

    @cached_property
    def label(self) -> str:
        """Compact stable text form, used in annotations and logs: ``batch_size=64,amp=on``."""
        parts = []
        for key, value in self.knobs:
            shown = ("on" if value else "off") if isinstance(value, bool) else value
            parts.append(f"{key}={shown}")
        return ",".join(parts)

    @classmethod
    def from_dict(cls, knobs: Mapping[str, KnobValue]) -> Configuration:
        return cls(tuple(knobs.items()))


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    array.setflags(write=False)
    return array


@dataclass(frozen=True, eq=False)
class ProfileFamily:
    """RST output for one workload on one hardware signature: K profiles p = (R(c), T(c)).

    Arrays are row-aligned with ``configs``:

    * ``resources``  (K, 4)  per-GPU demand, units of :mod:`.resources`
    * ``throughput`` (K,)    isolated throughput T(c) in ``throughput_unit`` (> 0)
    * ``estimated``  (K,)    True where T/R came from nearest-neighbour fill, not measurement
    * ``features``   (K, 14) per-job interference features (see ``interference.features``)

    Construction validates everything: NaN, infinities, negative numbers or a
    shape mismatch raise :class:`InvalidProfileError` naming the workload and row.
    """

    workload: str
    kind: JobKind
    configs: tuple[Configuration, ...]
    resources: np.ndarray
    throughput: np.ndarray
    features: np.ndarray
    estimated: np.ndarray | None = None
    hardware: str = "A100-SXM4-40GB"
    throughput_unit: str = "samples/s"
    param_count: float = 0.0

    def __post_init__(self) -> None:
        k = len(self.configs)
        name = self.workload
        if k == 0:
            raise InvalidProfileError(f"workload {name!r}: profile family has no configurations")
        resources = np.asarray(self.resources, dtype=np.float64)
        throughput = np.asarray(self.throughput, dtype=np.float64)
        features = np.asarray(self.features, dtype=np.float32)
        estimated = (
            np.zeros(k, dtype=bool)
            if self.estimated is None
            else np.asarray(self.estimated, dtype=bool)
        )
        expected = {
            "resources": (resources, (k, NUM_RESOURCES)),
            "throughput": (throughput, (k,)),
            "estimated": (estimated, (k,)),
        }
        for label, (array, shape) in expected.items():
            if array.shape != shape:
                raise InvalidProfileError(
                    f"workload {name!r}: {label} has shape {array.shape}, expected {shape}"
                )
        if features.ndim != 2 or features.shape[0] != k:
            raise InvalidProfileError(
                f"workload {name!r}: features has shape {features.shape}, expected ({k}, F)"
            )
        for label, array in (("resources", resources), ("throughput", throughput)):
            bad = ~np.isfinite(array)
            if bad.any():
                row = int(np.argwhere(bad)[0][0])
                raise InvalidProfileError(
                    f"workload {name!r}: {label} of {self.configs[row].label!r} is not finite"
                )
            negative = array < 0
            if negative.any():
                row = int(np.argwhere(negative)[0][0])
                raise InvalidProfileError(
                    f"workload {name!r}: {label} of {self.configs[row].label!r} is negative"
                )
        if not np.isfinite(features).all():
            raise InvalidProfileError(f"workload {name!r}: interference features are not finite")
        zero = throughput <= 0
        if zero.any():
            row = int(np.argmax(zero))
            raise InvalidProfileError(
                f"workload {name!r}: throughput of {self.configs[row].label!r} must be > 0"
            )
        over = resources[:, 0] > 1.0 + 1e-9
        if over.any():
            row = int(np.argmax(over))
            raise InvalidProfileError(
                f"workload {name!r}: SM share of {self.configs[row].label!r} exceeds one GPU"
            )
        object.__setattr__(self, "resources", _readonly(resources))
        object.__setattr__(self, "throughput", _readonly(throughput))
        object.__setattr__(self, "features", _readonly(features))
        object.__setattr__(self, "estimated", _readonly(estimated))

    @property
    def size(self) -> int:
        return len(self.configs)

    @property
    def fastest_index(self) -> int:
        """c_max = argmax T(c): the default configuration of a job that asks for none."""
        return int(np.argmax(self.throughput))

    def index_of(self, config: Configuration | Mapping[str, KnobValue]) -> int:
        """Row of ``config``; raises KeyError naming the configuration when absent."""
        wanted = config.as_dict() if isinstance(config, Configuration) else dict(config)
        for i, candidate in enumerate(self.configs):
            if candidate.as_dict() == wanted:
                return i
        raise KeyError(f"{self.workload}: no configuration {wanted}")


@dataclass(frozen=True, slots=True)
class Job:
    """A training or offline-inference job as the planner sees it.

    ``min_throughput`` is L_j in the family's throughput unit (0 = no floor).
    ``allowed`` restricts the configuration rows (None = every row; a ``fixed``
    job has exactly one).  ``devices`` is empty while the job is pending.
    """

    id: str
    family: str
    kind: JobKind = JobKind.TRAINING
    gpus: int = 1
    weight: float = 1.0
    min_throughput: float = 0.0
    mode: Mode = Mode.ELASTIC
    allowed: tuple[int, ...] | None = None
    current_config: int | None = None
    devices: tuple[DeviceRef, ...] = ()
    arrival_time: float = 0.0
    user: str = ""
    """Who submitted it (for :mod:`.duration`'s per-user estimates; empty when unknown)."""
    attained_gpu_seconds: float = 0.0
    """GPU-seconds of service received *before* the current run (Tiresias' 2D attained
    service); the current run adds ``gpus * (Snapshot.now - started_at)``."""
    started_at: float | None = None
    """When the current run began, on the snapshot's clock (None: pending or unknown)."""
    expected_duration_s: float = 0.0
    """The driver's estimate of the whole run time, learned from completed jobs
    (:mod:`.duration`); 0 when there is no history.  Never the true duration."""
    preemptible: bool = True
    """Whether the driver can stop this job and start it again elsewhere: preempt or
    requeue it, or move it to other devices.  The simulator can always; the extender
    only for a pod that allows migration and has a controller to recreate it
    (``service.pods.unmovable``).  The planner picks no such job as a band-preemption
    victim, nor to leave a harmful pair or to spread, so it never counts on devices
    that would not free."""
    barred_nodes: frozenset[str] = frozenset()
    """Nodes the planner must not place this job on when it places it afresh (admits it,
    or finds it new devices): the driver knows the job could never start there (the
    extender: a cordoned node, or a taint the pod does not tolerate, which kube-scheduler
    would never bind it to).  Devices a running job holds are kept even on such a node
    (a cordon evicts nothing)."""

    @property
    def running(self) -> bool:
        return bool(self.devices)

    def problems(self) -> list[str]:
        """Every reason this record cannot be planned (empty when valid)."""
        found = []
        if not self.id:
            found.append("job id is empty")
        if self.gpus < 1:
            found.append(f"job {self.id}: gpus must be >= 1, got {self.gpus}")
        if not (math.isfinite(self.weight) and self.weight > 0):
            found.append(f"job {self.id}: weight must be a positive number, got {self.weight}")
        if not (math.isfinite(self.min_throughput) and self.min_throughput >= 0):
            found.append(f"job {self.id}: min_throughput must be >= 0, got {self.min_throughput}")
        if self.running and len(self.devices) != self.gpus:
            found.append(
                f"job {self.id}: runs on {len(self.devices)} devices but asks for {self.gpus}"
            )
        if self.running and self.current_config is None:
            found.append(f"job {self.id}: running but has no current configuration")
        for name in ("attained_gpu_seconds", "expected_duration_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                found.append(f"job {self.id}: {name} must be a finite number >= 0, got {value}")
        if self.started_at is not None and not math.isfinite(self.started_at):
            found.append(f"job {self.id}: started_at must be a finite time, got {self.started_at}")
        return found


@dataclass(frozen=True, eq=False)
class JobColumns:
    """The fields of every job as arrays (one pass over the records)."""

    gpus: np.ndarray  # float
    weight: np.ndarray
    floor: np.ndarray
    held: np.ndarray  # int: devices the job runs on now
    current: np.ndarray  # int: current configuration row, -1 when none
    fixed: np.ndarray  # bool: mode is fixed
    arrival: np.ndarray  # float: arrival time
    family_names: tuple[str, ...]  # sorted distinct workload families of the jobs
    family_code: np.ndarray  # int: each job's position in ``family_names``
    restricted: np.ndarray  # int: rows whose ``allowed`` is set
    attained: np.ndarray  # float: GPU-seconds served before the current run
    started: np.ndarray  # float: start of the current run, NaN when none
    expected: np.ndarray  # float: estimated whole run time (s), 0 when unknown
    preemptible: np.ndarray  # bool: the driver can stop, requeue or move the job


def _floats(values: list[float] | list[int]) -> np.ndarray:
    return np.frombuffer(typed_array("d", values), dtype=np.float64)


def job_columns(jobs: tuple[Job, ...]) -> JobColumns:
    # One list comprehension per field, converted through ``array``: several times
    # cheaper than one comprehension of tuples converted by ``np.array``.
    n = len(jobs)
    families = [j.family for j in jobs]
    names = tuple(sorted(set(families)))
    code = dict(zip(names, range(len(names)), strict=True))
    current = [j.current_config for j in jobs]
    modes = [j.mode for j in jobs]
    allowed = [j.allowed for j in jobs]
    # Most jobs are elastic and unrestricted: list.count (C) decides before any per-job test.
    fixed = (
        np.array([m is Mode.FIXED for m in modes], dtype=bool).reshape(n)
        if modes.count(Mode.FIXED)
        else np.zeros(n, dtype=bool)
    )
    restricted = (
        np.array([row for row, a in enumerate(allowed) if a is not None], dtype=np.intp)
        if allowed.count(None) != n
        else np.zeros(0, dtype=np.intp)
    )
    stoppable = [j.preemptible for j in jobs]
    preemptible = (
        np.array(stoppable, dtype=bool).reshape(n)
        if stoppable.count(False)
        else np.ones(n, dtype=bool)
    )
    return JobColumns(
        gpus=_floats([j.gpus for j in jobs]),
        weight=_floats([j.weight for j in jobs]),
        floor=_floats([j.min_throughput for j in jobs]),
        held=np.fromiter(map(len, [j.devices for j in jobs]), np.intp, n),
        current=np.array(
            [-1 if c is None else c for c in current] if None in current else current,
            dtype=np.intp,
        ).reshape(n),
        fixed=fixed,
        arrival=_floats([j.arrival_time for j in jobs]),
        family_names=names,
        family_code=np.fromiter(map(code.__getitem__, families), np.intp, n),
        restricted=restricted,
        attained=_floats([j.attained_gpu_seconds for j in jobs]),
        started=_floats([math.nan if j.started_at is None else j.started_at for j in jobs]),
        expected=_floats([j.expected_duration_s for j in jobs]),
        preemptible=preemptible,
    )


class DeviceIndex:
    """Static facts of a cluster's GPUs, in one order: device ``d`` is ``refs[d]``.

    Derived from the nodes alone and read by validation, bin-packing and the
    extender every epoch; :func:`device_index` builds it once per ``nodes``
    tuple (drivers pass the same tuple while the cluster does not change).
    """

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.refs: list[DeviceRef] = [(n.name, g.index) for n in nodes for g in n.gpus]
        self.index: dict[DeviceRef, int] = dict(zip(self.refs, range(len(self.refs)), strict=True))
        self.per_node = np.array([len(n.gpus) for n in nodes], dtype=np.intp)
        self.node_of = np.repeat(np.arange(len(nodes), dtype=np.intp), self.per_node)
        self.memory_total = np.array(
            [g.memory_mib for n in nodes for g in n.gpus], dtype=np.float64
        ).reshape(len(self.refs))
        self.products: list[str] = [g.product for n in nodes for g in n.gpus]
        self.cpu = np.array([n.cpu_cores for n in nodes], dtype=np.float64)
        self.ram = np.array([n.host_mem_mib for n in nodes], dtype=np.float64)
        self.problems: list[str] = []
        names = [n.name for n in nodes]
        self.node_names: tuple[str, ...] = tuple(names)
        self.node_position: dict[str, int] = dict(zip(names, range(len(names)), strict=True))
        if len(set(names)) != len(names):
            self.problems.append("duplicate node names")
        if len(self.index) != len(self.refs):
            self.problems.append("duplicate GPU indices on a node")
        with np.errstate(invalid="ignore"):
            bad = ~(np.isfinite(self.memory_total) & (self.memory_total >= 0))
        for d in np.flatnonzero(bad).tolist():
            node, gpu = self.refs[d]
            self.problems.append(f"node {node} gpu {gpu}: bad memory {self.memory_total[d]}")

    @property
    def size(self) -> int:
        return len(self.refs)


_INDEXES: tuple[tuple[tuple[Node, ...], DeviceIndex], ...] = ()
_INDEXES_KEPT = 4


def device_index(nodes: tuple[Node, ...]) -> DeviceIndex:
    """The :class:`DeviceIndex` of ``nodes``, memoised by identity for the last few tuples.

    Nodes are frozen, so a tuple seen before describes the same devices; the
    memo holds a reference to each tuple, so an identity match cannot be a
    recycled id.  Rebinding the tuple of entries is atomic, so threads need no lock.
    """
    global _INDEXES
    for known, index in _INDEXES:
        if known is nodes:
            return index
    index = DeviceIndex(nodes)
    _INDEXES = (*_INDEXES[-(_INDEXES_KEPT - 1) :], (nodes, index))
    return index


class MeasuredRates(NamedTuple):
    """A family's solo rates measured by the closed loop, per configuration."""

    rate: np.ndarray
    """(K,) solo rate in the family's throughput unit; NaN where none was measured."""
    windows: np.ndarray
    """(K,) solo windows behind each rate (at most ``observations.RESTORED_WINDOWS``)."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one planning epoch needs, as pure data."""

    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...]
    families: Mapping[str, ProfileFamily]
    epoch: int = 0
    observed: Mapping[str, ObservedSlowdown] = field(default_factory=dict)
    """Per running job id, its observed slowdown (closed loop, :mod:`.observations`);
    a job absent here has not been observed (yet)."""
    unmeasured: Mapping[str, float] = field(default_factory=dict)
    """Running jobs whose windows cannot be measured yet (no reference rate: neither they
    nor their family ran alone at that configuration) -> their newest window's end; they
    run alone first (closed loop, :mod:`.planner.protect`)."""
    solo_rates: Mapping[str, MeasuredRates] = field(default_factory=dict)
    """Per family, its solo rate measured at each configuration in its throughput unit
    and the windows behind it (closed loop, :mod:`.planner.observed_throughput`)."""
    now: float = 0.0
    """The driver's clock at this snapshot (seconds), for the age of observations."""

    @cached_property
    def columns(self) -> JobColumns:
        """Job fields as arrays, computed once per snapshot (validation and planning share it)."""
        return job_columns(self.jobs)

    @cached_property
    def devices(self) -> DeviceIndex:
        return device_index(self.nodes)

    @cached_property
    def workers(self) -> np.ndarray:
        """Device index of every worker of every running job, jobs in row order (-1: unknown)."""
        refs = chain.from_iterable([j.devices for j in self.jobs])
        found = map(self.devices.index.get, refs, repeat(-1))
        return np.fromiter(found, np.intp, int(self.columns.held.sum()))

    def validate(self) -> None:
        """Raise :class:`InvalidSnapshotError` listing every problem found."""
        devices = self.devices
        problems: list[str] = list(devices.problems)
        jobs = self.jobs
        if len({j.id for j in jobs}) != len(jobs):
            problems.append("duplicate job ids")
        # Vectorised screen first; messages are built only for the records that fail it.
        n = len(jobs)
        families = self.families
        cols = self.columns
        gpus, weight, floor, held, current = (
            cols.gpus,
            cols.weight,
            cols.floor,
            cols.held,
            cols.current,
        )
        sizes = np.array(
            [families[f].size if f in families else 0 for f in cols.family_names], dtype=np.intp
        )
        size = sizes[cols.family_code] if n else np.zeros(0, dtype=np.intp)
        with np.errstate(invalid="ignore"):
            bad = (
                (gpus < 1)
                | ~(weight > 0)
                | ~np.isfinite(weight)
                | ~(floor >= 0)
                | ~np.isfinite(floor)
                | (size == 0)
                | ((held > 0) & ((held != gpus) | (current < 0) | (current >= size)))
                | ((current >= size) & (size > 0))
                | ~(cols.attained >= 0)
                | ~np.isfinite(cols.attained)
                | ~(cols.expected >= 0)
                | ~np.isfinite(cols.expected)
                | np.isinf(cols.started)
            )
        unknown = self.workers < 0
        if unknown.any():
            owners = np.repeat(np.arange(n), held)
            bad[owners[unknown]] = True
        for row in np.flatnonzero(bad).tolist():
            problems.extend(_job_problems(jobs[row], families.get(jobs[row].family), devices.index))
        for row in cols.restricted.tolist():
            job = jobs[row]
            family = families.get(job.family)
            if (
                job.allowed is not None
                and family is not None
                and any(not 0 <= c < family.size for c in job.allowed)
            ):
                problems.append(f"job {job.id}: allowed configuration row out of range")
        if problems:
            raise InvalidSnapshotError("; ".join(problems))


def _job_problems(
    job: Job, family: ProfileFamily | None, devices: Mapping[DeviceRef, object]
) -> list[str]:
    """Every problem of one job record within a snapshot (used to build error messages)."""
    found = job.problems()
    if family is None:
        found.append(f"job {job.id}: unknown workload family {job.family!r}")
        return found
    if job.current_config is not None and not 0 <= job.current_config < family.size:
        found.append(f"job {job.id}: current configuration row out of range")
    for ref in job.devices:
        if ref not in devices:
            found.append(f"job {job.id}: runs on unknown device {ref[0]}/gpu{ref[1]}")
    return found


class Assignment(NamedTuple):
    """The plan's decision for one job that runs (or starts) this epoch.

    A NamedTuple rather than a frozen dataclass: a plan holds one per job and is
    rebuilt every epoch, and tuples are several times cheaper to create.
    """

    job_id: str
    config_index: int
    configuration: Configuration
    devices: tuple[DeviceRef, ...]
    memory_budget_mib: float
    throughput: float
    predicted_slowdown: float
    tolerance: float
    action: Action
    estimated: bool = False


_ACTIONS = (Action.KEEP, Action.RECONFIGURE, Action.MIGRATE, Action.ADMIT)


class PlanRows(NamedTuple):
    """A plan's assignments as columns over the rows of the snapshot it was made from.

    For consumers that rebuild the plan's device state in bulk (the extender's
    placement view): position ``k`` is snapshot row ``rows[k]``; a job absent
    from ``moved`` keeps the devices it holds in the snapshot.
    """

    ids: list[str]
    rows: np.ndarray  # (M,) snapshot row of each assignment
    config: np.ndarray  # (M,) configuration index
    tolerance: np.ndarray  # (M,)
    moved: Mapping[int, tuple[DeviceRef, ...]]  # position -> devices, if not kept in place


class AssignmentColumns(Mapping[str, Assignment]):
    """A plan's assignments held as columns; each :class:`Assignment` is built when read.

    The planner emits one decision per running job every epoch, and most are
    KEEP.  Building thousands of records nobody reads would dominate a large
    epoch, so records are made on lookup, all at once (in bulk) on the first
    full iteration, and :meth:`changed` lists only the jobs with something to do.
    Read-only and safe to share between threads (a race builds equal records).
    """

    def __init__(
        self,
        ids: list[str],
        jobs: list[Job],
        config: np.ndarray,
        configurations: tuple[tuple[Configuration, ...], ...],
        family: np.ndarray,
        moved: Mapping[int, tuple[DeviceRef, ...]],
        memory: np.ndarray,
        throughput: np.ndarray,
        slowdown: np.ndarray,
        tolerance: np.ndarray,
        action: np.ndarray,
        estimated: np.ndarray,
        rows: np.ndarray | None = None,
        source: tuple[Job, ...] | None = None,
    ) -> None:
        self._ids = ids
        self._jobs = jobs
        self._config = config
        self._configurations = configurations
        self._family = family
        self._moved = moved  # position -> devices, for jobs not kept on their own devices
        self._memory = memory
        self._throughput = throughput
        self._slowdown = slowdown
        self._tolerance = tolerance
        self._action = action  # codes into _ACTIONS
        self._estimated = estimated
        self._rows = rows  # snapshot row of each assignment, rows into ``source``
        self._source = source
        self._where: dict[str, int] | None = None
        self._records: dict[str, Assignment] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._position()

    def __getitem__(self, job_id: str) -> Assignment:
        if self._records is not None:
            return self._records[job_id]
        return self._record(self._position()[job_id])

    def get(self, job_id: str, default: Assignment | None = None) -> Assignment | None:  # type: ignore[override]
        k = self._position().get(job_id)
        if k is None:
            return default
        return self._records[job_id] if self._records is not None else self._record(k)

    def values(self) -> ValuesView[Assignment]:
        return self._all().values()

    def items(self) -> ItemsView[str, Assignment]:
        return self._all().items()

    def changed(self) -> list[Assignment]:
        """Assignments whose action is not KEEP (what a driver must act on)."""
        return [self._record(k) for k in np.flatnonzero(self._action).tolist()]

    def rows_in(self, jobs: tuple[Job, ...]) -> PlanRows | None:
        """The columns over ``jobs`` (a snapshot's jobs), or None unless the plan was
        made from that very tuple (its rows would not line up)."""
        if self._rows is None or self._source is not jobs:
            return None
        return PlanRows(self._ids, self._rows, self._config, self._tolerance, self._moved)

    def _position(self) -> dict[str, int]:
        if self._where is None:
            self._where = dict(zip(self._ids, range(len(self._ids)), strict=True))
        return self._where

    def _devices(self, k: int) -> tuple[DeviceRef, ...]:
        moved = self._moved.get(k)
        return self._jobs[k].devices if moved is None else moved

    def _record(self, k: int) -> Assignment:
        config = int(self._config[k])
        return Assignment(
            self._ids[k],
            config,
            self._configurations[int(self._family[k])][config],
            self._devices(k),
            float(self._memory[k]),
            float(self._throughput[k]),
            float(self._slowdown[k]),
            float(self._tolerance[k]),
            _ACTIONS[int(self._action[k])],
            bool(self._estimated[k]),
        )

    def _all(self) -> dict[str, Assignment]:
        """Every record, built column-wise once (tuple.__new__ over zipped columns)."""
        if self._records is None:
            ids, configs = self._ids, self._config.tolist()
            by_family = self._configurations
            configurations = [
                by_family[f][c] for f, c in zip(self._family.tolist(), configs, strict=True)
            ]
            devices = [job.devices for job in self._jobs]
            for k, moved in self._moved.items():
                devices[k] = moved
            fields = zip(
                ids,
                configs,
                configurations,
                devices,
                self._memory.tolist(),
                self._throughput.tolist(),
                self._slowdown.tolist(),
                self._tolerance.tolist(),
                [_ACTIONS[c] for c in self._action.tolist()],
                self._estimated.tolist(),
                strict=True,
            )
            records = map(tuple.__new__, repeat(Assignment), fields)
            self._records = dict(zip(ids, records, strict=True))
        return self._records

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping):
            return NotImplemented
        return dict(self.items()) == dict(other.items())

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"AssignmentColumns({len(self)} jobs)"


@dataclass(frozen=True)
class Plan:
    """The core's output: who runs where with which configuration, and the prices.

    ``queued`` holds pending jobs that could not start (``queue_reasons`` says why);
    ``rejected`` maps jobs that can never run as submitted (e.g. no configuration
    meets their floor) to a human-readable reason.  ``stats`` carries counters and, when the driver
    passed a timer, per-phase milliseconds.
    """

    epoch: int
    prices: np.ndarray
    assignments: Mapping[str, Assignment]
    queued: tuple[str, ...] = ()
    rejected: Mapping[str, str] = field(default_factory=dict)
    queue_reasons: Mapping[str, str] = field(default_factory=dict)
    """Why each queued job waits this epoch (no room, ESP's prices, the share-or-wait
    rule), for the operator: ``/jobs`` and ``kubectl elastico why``."""
    preempted: tuple[str, ...] = ()
    violations: tuple[tuple[str, str, float], ...] = ()
    stats: Mapping[str, float] = field(default_factory=dict)
    separated: tuple[tuple[str, str], ...] = ()
    """Closed loop: job pairs held apart (observed harm), carried to the next epoch."""
    stepped: tuple[tuple[str, str], ...] = ()
    """Closed loop: job pairs that already stepped down once for observed harm."""
    protections: tuple[tuple[str, str, str, str, float, float], ...] = ()
    """This epoch's separations: (victim, partner, action, actor, observed S, tau)."""
    utilization: float | None = None
    """U(t) behind this plan's tolerances: offered load, smoothed over time
    (``PlannerSettings.utilization_smoothing_s``); None from a policy without tau.
    The next plan continues the average."""
    planned_at: float = 0.0
    """The snapshot's clock (``Snapshot.now``) when this plan was made."""
    utilization_history_s: float = 0.0
    """How long the average behind ``utilization`` has run (0 for a driver's first plan)."""

    def price_map(self) -> dict[str, float]:
        return {name: float(p) for name, p in zip(RESOURCE_NAMES, self.prices, strict=True)}

    def changed(self) -> list[Assignment]:
        """The assignments a driver must act on (action other than KEEP)."""
        if isinstance(self.assignments, AssignmentColumns):
            return self.assignments.changed()
        return [a for a in self.assignments.values() if a.action is not Action.KEEP]

    @classmethod
    def empty(cls) -> Plan:
        return cls(epoch=0, prices=np.zeros(NUM_RESOURCES), assignments={})
