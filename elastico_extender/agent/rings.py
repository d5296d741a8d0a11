"""Per-pod progress from the profiler shim's rings: kernel launches per second (issue 11).

Where the rings are: ``elastico-run`` points the shim at
``/run/elastico/rings/<pod uid>/<container>/`` in the container (the pod uid comes from
the downward API as ``ELASTICO_POD_UID``, the container's name from the webhook as
``ELASTICO_CONTAINER_NAME``), so every ``elastico-shim-<pid>.ring`` there belongs to that
pod, whatever its processes' ids are inside the container, and two containers' processes
with the same id do not share a file (:func:`pod_rings`).  What the webhook mounts at
/run/elastico/rings decides where the agent finds the pod's directory on the node
(:meth:`PodRings.directory`):

* ``emptyDir`` (the default, admitted at every Pod Security level): the kubelet keeps a
  pod's emptyDir volume ``elastico-rings`` at
  ``<kubelet root>/pods/<pod uid>/volumes/kubernetes.io~empty-dir/elastico-rings`` (for
  ``medium: Memory`` it mounts a tmpfs at that same path), so the rings are
  :func:`kubelet_ring_directory`.  The pod uid names the kubelet's directory, and the
  directory inside it must carry the same uid: a pod can only write into its own volume,
  so it cannot pass its rings off as another pod's.  The kubelet removes it with the pod.
* ``hostPath`` (legacy, ``--ring-root``): ``<ring root>/<pod uid>/`` on a host directory
  every opted-in pod shares; the agent removes a departed pod's directory
  (:meth:`PodRings.remove_directory`).

The kubelet layout is looked at first, then the ring root, so pods admitted under either
mode are read while a cluster switches.  A uid with neither directory has no rings (no
rate, no error).

What is read: only the ring *headers*, never the records (the agent consumes nothing, so a
profiler draining the same ring is undisturbed), each window anew with one ``pread``
(:func:`~elastico_extender.profiling.ring.read_header`), never through a mapping: the pod
owns the file, and a ring truncated under a mapping (by the pod, or by an older shim
that re-created it with ``O_TRUNC``) would fault the agent with SIGBUS.  The header's
``launches`` counter is cumulative and published at the shim's flushes (every
``ELASTICO_SHIM_FLUSH_MS``, default 2 s), which also stamp ``last_flush_monotonic_ns``
and ``last_flush_realtime_ns``.  A process's launch rate over a window is therefore

    r_i = (launches_i(now) - launches_i(before)) / (flush_i(now) - flush_i(before))

measured on the process's own flush clock, so the window's edges cost no error even when
the agent's window is not a multiple of the flush interval.  The flush times are the
monotonic stamps, so a step of the wall clock changes no rate; the realtime stamp dates
the window (rings of a shim older than the monotonic stamps, zero there, use it for both).
A pod's rate is the sum over its processes.  A process first seen after the pod's previous
scan started at ``start_monotonic_ns`` with zero launches, so short-lived processes
(data-loader workers, restarts) are counted from their start; processes already running
when the agent starts give a rate from their second reading on.  A counter that goes
backwards (a new process reusing the pid's file) restarts that process's baseline.  An
exec keeps the pid and the ring: the new image continues the counters (the shim), so
a launcher or torchrun that re-execs itself reads as one process.

Restarts: the shim's flusher stamps the header every ``flush_interval_ns`` whether or not
the process launched anything, so a process is alive while its last flush is at most
:data:`LIVE_FLUSHES` intervals old (:meth:`ProcessCounters.alive`).  Only processes that
have launched a kernel count: a restarted workload's process creates its ring at its
first allocation and may load a model for minutes before its first launch, and a
helper that never launches adds nothing to any rate.  A pod's window is
:attr:`~PodLaunches.steady` when the same launching processes were alive at both its
ends and none started, or began launching, in it (a window in which the new process
began launching part-way holds a fraction of its rate: a false slowdown); the agent
reports no other (``agent/daemon.py``, "Restarts").  Beside its
rings, ``elastico-run`` says which assigned configuration the workload runs under
(:func:`launched_configurations`).

See docs/observability.md for why launches per second measure progress and its limits.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from elastico_extender.annotations import LAUNCHED_CONFIGURATION_FILE, RINGS_VOLUME
from elastico_extender.errors import RingFormatError
from elastico_extender.profiling.ring import read_header, ring_pid
from elastico_extender.userfiles import read_bounded

__all__ = [
    "EMPTY_DIR_PLUGIN",
    "KUBELET_ROOT",
    "PodLaunches",
    "PodRings",
    "ProcessCounters",
    "ProcessKey",
    "kubelet_ring_directory",
    "launched_configurations",
    "pod_rings",
]

log = logging.getLogger(__name__)

MAX_PROCESSES_PER_POD = 512
"""Rings read per pod and window (each one header read; bounded all the same)."""
MAX_CONTAINER_DIRECTORIES = 64
"""Subdirectories of a pod's ring directory looked into (one per profiled container)."""
MAX_DIRECTORY_ENTRIES = 16384
"""Entries of one ring directory looked at per window (a pod's processes leave a ring
each, so thousands are possible; a pod that makes millions must not cost the agent
seconds and hundreds of MiB every window)."""
LIVE_FLUSHES = 2.5
"""A process whose last flush is older than this many of its flush intervals has stopped
(the shim's flusher stamps the header every interval, launches or not)."""
LIVE_SLACK_S = 0.5
"""Seconds added to that bound: a flusher thread of a busy node wakes late."""
MAX_CONFIGURATION_BYTES = 64 * 1024
"""Largest launched-configuration file read (a label is the assigned-configuration
annotation, far smaller; the pod writes the file and may make it any size)."""
MAX_UNUSABLE_REMEMBERED = 4096
"""Unreadable rings remembered, so that each is reported once (not every window)."""
KUBELET_ROOT = "/var/lib/kubelet"
"""The kubelet's ``--root-dir`` default (k3s keeps it; MicroK8s, k0s and some managed
distributions move it: the agent's ``--kubelet-root``)."""
EMPTY_DIR_PLUGIN = "kubernetes.io~empty-dir"
"""The emptyDir plugin's name ``kubernetes.io/empty-dir`` as the kubelet escapes it in
paths (``/`` -> ``~``; pkg/volume/emptydir)."""


ProcessKey = tuple[str, int]
"""(container directory, pid): a process of a pod (``""``: rings directly in the pod's
directory)."""


def _plain_uid(uid: str) -> bool:
    """A uid usable as one path component (API server uids are UUIDs)."""
    return 0 < len(uid) <= 128 and "/" not in uid and "\0" not in uid and uid not in (".", "..")


def _listing(directory: Path) -> list[os.DirEntry[str]]:
    """At most :data:`MAX_DIRECTORY_ENTRIES` entries of ``directory``, none when it cannot
    be read: the pod owns it and may fill it with any number of files."""
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        return list(itertools.islice(entries, MAX_DIRECTORY_ENTRIES))
    return []


def pod_rings(directory: Path) -> dict[tuple[str, int], Path]:
    """``(container, pid) -> ring`` for a pod's ring directory: the rings in it (container
    ``""``) and in its subdirectories, one per container (``elastico-run`` makes them
    from ``ELASTICO_CONTAINER_NAME``: the containers of a pod have pid namespaces of
    their own, so their processes' ids may coincide).  Links are not followed, and each
    directory's listing is bounded (:func:`_listing`)."""
    found: dict[tuple[str, int], Path] = {}
    containers: list[os.DirEntry[str]] = []
    for entry in _listing(directory):
        pid = ring_pid(entry.name)
        if pid is not None:
            found["", pid] = Path(entry.path)
        elif len(containers) < MAX_CONTAINER_DIRECTORIES and entry.is_dir(follow_symlinks=False):
            containers.append(entry)
    for sub in containers:
        for entry in _listing(Path(sub.path)):
            pid = ring_pid(entry.name)
            if pid is not None:
                found[sub.name, pid] = Path(entry.path)
    return dict(itertools.islice(sorted(found.items()), MAX_PROCESSES_PER_POD))


def launched_configurations(directory: Path) -> frozenset[str]:
    """The configurations ``elastico-run`` says the pod's workloads run under: its
    ``LAUNCHED_CONFIGURATION_FILE`` in the pod's ring directory and in each container's
    (at most :data:`MAX_CONFIGURATION_BYTES` each, never through a link, never blocking;
    a file that cannot be read as such is left out)."""
    found = set()
    places = [directory]
    for entry in _listing(directory):
        if len(places) > MAX_CONTAINER_DIRECTORIES:
            break
        if ring_pid(entry.name) is None and entry.is_dir(follow_symlinks=False):
            places.append(Path(entry.path))
    for place in places:
        try:
            raw = read_bounded(place / LAUNCHED_CONFIGURATION_FILE, MAX_CONFIGURATION_BYTES,
                               follow=False)  # fmt: skip
            found.add(raw.decode("utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return frozenset(found)


def kubelet_ring_directory(kubelet_root: str | Path, uid: str, volume: str = RINGS_VOLUME) -> Path:
    """Where a pod's rings lie on the node when its rings volume is an emptyDir."""
    return Path(kubelet_root) / "pods" / uid / "volumes" / EMPTY_DIR_PLUGIN / volume / uid


@dataclass(frozen=True, slots=True)
class ProcessCounters:
    """What one ring header says about its process at one read."""

    launches: int
    flushed_at: float  # seconds since the epoch (the shim's CLOCK_REALTIME)
    started_at: float
    peak_bytes: int
    live_bytes: int
    flushed_mono: float = 0.0  # the shim's CLOCK_MONOTONIC, s; 0: a shim without it
    started_mono: float = 0.0
    flush_interval: float = 0.0  # s between the shim's flushes; 0: not stated

    def same_process(self, before: ProcessCounters) -> bool:
        """Whether ``before`` was read from the process this reading is of.  A ring's name
        holds only the pid: a later process given the same pid (a restarted container whose
        volume stayed) starts it afresh, with its own start time.  An exec continues it."""
        started = (self.started_at, self.started_mono)
        return started == (before.started_at, before.started_mono) and (
            self.launches >= before.launches
        )

    def seconds_since(self, before: ProcessCounters) -> float:
        """Time between two flushes: on the monotonic clock where both readings have it,
        so that a step of the wall clock between them changes no rate."""
        if self.flushed_mono > 0 and before.flushed_mono > 0:
            return self.flushed_mono - before.flushed_mono
        return self.flushed_at - before.flushed_at

    def alive(self, before: ProcessCounters | None, now: float) -> bool:
        """Whether the process runs at ``now`` (node wall clock): its last flush is within
        :data:`LIVE_FLUSHES` of its flush intervals (plus :data:`LIVE_SLACK_S`); a ring
        that does not state its interval must have flushed since ``before``."""
        if self.flush_interval > 0:
            return now - self.flushed_at <= LIVE_FLUSHES * self.flush_interval + LIVE_SLACK_S
        return before is not None and self.seconds_since(before) > 0


@dataclass(frozen=True, slots=True)
class PodLaunches:
    """One pod's window from its rings."""

    rate: float | None
    """Kernel launches per second summed over processes; None until a window exists."""
    processes: int
    peak_mem_mib: float
    """Sum over its processes of the shim's peak device bytes since each started, MiB."""
    live_mem_mib: float
    end: float
    """Newest flush time among its processes (the window's end, seconds since the epoch)."""
    steady: bool = True
    """Whether the same CUDA processes ran all through the window: none started or began
    launching kernels, none stopped, at least one alive (module doc, "Restarts").  False
    for a pod's first window."""
    configurations: frozenset[str] = frozenset()
    """The configurations ``elastico-run`` says the workload runs under
    (:func:`launched_configurations`; empty: not said)."""
    running_since: float | None = None
    """When its current run began (the shim's clock, seconds since the epoch): the latest
    time one of its live processes began launching kernels, which is the process's start
    for one that launched from its first reading (or was launching when the agent first
    saw it), and the end of the window in which it began for one that ran without
    launching first (loading a model: when in the window it began is unknown); None when
    none is alive.  The agent counts a run's warm-up from it (``agent/daemon.py``)."""


class PodRings:
    """Follows the rings of the node's pods (not thread-safe).

    ``root``: the legacy shared host directory (hostPath mode), None for none;
    ``kubelet_root``: the kubelet's root directory, whose ``pods/`` holds each pod's
    emptyDir volumes (default mode), None for none.  Rings are opened read-only."""

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        kubelet_root: str | Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(root) if root else None
        self.kubelet_root = Path(kubelet_root) if kubelet_root else None
        self.clock = clock  # the node's wall clock, the shim's realtime stamps' clock
        self._last: dict[tuple[str, ProcessKey], ProcessCounters] = {}
        # (pod, process) -> when the process began launching kernels (its run's start)
        self._began: dict[tuple[str, ProcessKey], float] = {}
        self._live: dict[str, frozenset[ProcessKey]] = {}  # pod -> alive in its last window
        self._scanned: dict[str, float] = {}  # pod uid -> newest flush time at last scan
        # rings unreadable at the last scan -> whether that was told (bounded, oldest out)
        self._unusable: OrderedDict[Path, bool] = OrderedDict()

    def close(self) -> None:
        """Nothing stays open between reads; kept for the callers' symmetry."""

    def pods(self) -> list[str]:
        """Pod uids with a directory under the shared host root (hostPath mode): the
        directories the agent must remove itself (the kubelet removes emptyDirs)."""
        if self.root is None or not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir())

    def directory(self, uid: str) -> Path | None:
        """The pod's ring directory on this node: its emptyDir through the kubelet's
        layout, else ``<root>/<uid>``; None when it has neither."""
        if not _plain_uid(uid):
            return None
        candidates = []
        if self.kubelet_root is not None:
            candidates.append(kubelet_ring_directory(self.kubelet_root, uid))
        if self.root is not None:
            candidates.append(self.root / uid)
        for path in candidates:
            # the last component is the pod's own doing: a directory, never a link
            if path.is_dir() and not path.is_symlink():
                return path
        return None

    def _read(self, uid: str) -> tuple[dict[ProcessKey, ProcessCounters], frozenset[str]]:
        """The pod's processes' counters, and the configurations it says they run."""
        found = {}
        directory = self.directory(uid)
        rings = pod_rings(directory) if directory is not None else {}
        launched = launched_configurations(directory) if rings and directory else frozenset()
        for process, path in rings.items():
            try:
                h = read_header(path)
            except (RingFormatError, OSError) as exc:  # being (re)created, or foreign
                self._unreadable(path, exc)
                continue
            self._unusable.pop(path, None)
            found[process] = ProcessCounters(
                launches=h["launches"],
                flushed_at=h["last_flush_realtime_ns"] / 1e9,
                started_at=h["start_realtime_ns"] / 1e9,
                peak_bytes=h["peak_bytes"],
                live_bytes=h["live_bytes"],
                flushed_mono=h["last_flush_monotonic_ns"] / 1e9,
                started_mono=h["start_monotonic_ns"] / 1e9,
                flush_interval=h["flush_interval_ns"] / 1e9,
            )
        for key in [k for k in self._last if k[0] == uid and k[1] not in rings]:
            del self._last[key]
        return found, launched

    def _unreadable(self, path: Path, exc: Exception) -> None:
        """A ring being created is short for an instant: one unreadable at two scans in a
        row (another layout version, not a ring) is logged as a warning, once."""
        told = self._unusable.pop(path, None)
        if told is False:
            log.warning("ring.unusable", extra={"path": str(path), "error": str(exc)})
        else:
            log.debug("ring.unreadable", extra={"path": str(path), "error": str(exc)})
        self._unusable[path] = told is not None
        while len(self._unusable) > MAX_UNUSABLE_REMEMBERED:
            self._unusable.popitem(last=False)

    def sample(self, uid: str) -> PodLaunches | None:
        """The pod's launch rate since the previous call for it; None without rings."""
        now, launched = self._read(uid)
        if not now:
            return None
        previous_scan = self._scanned.get(uid)
        rate = 0.0
        measured = False
        started = False
        live: set[ProcessKey] = set()  # alive, and has launched a kernel
        at = self.clock()
        for process, c in now.items():
            before = self._last.get((uid, process))
            if before is not None and not c.same_process(before):
                before = None  # the file now belongs to a new process
                self._began.pop((uid, process), None)
            new = previous_scan is not None and c.started_at >= previous_scan - 1.0
            launching = c.launches > 0  # a process that never launched adds to no rate
            if launching and c.alive(before, at):
                live.add(process)
            begun: float | None = None  # when a run that began in this window began
            if before is None and new:
                begun = c.started_at if launching else None
                before = ProcessCounters(
                    0, c.started_at, c.started_at, 0, 0, c.started_mono, c.started_mono
                )
            elif before is not None and before.launches == 0 and launching:
                # It ran without launching (loading a model, a helper) and began
                # launching some time in this window: when is unknown, so its run is
                # taken to begin at the window's end (its co-tenants' windows are mixed).
                begun = c.flushed_at
            if begun is not None:
                started = True
                self._began[(uid, process)] = begun
            elif launching:  # launching when first seen (the agent started later): since
                self._began.setdefault((uid, process), c.started_at)  # its start at most
            self._last[(uid, process)] = c
            if before is None:
                continue
            span = c.seconds_since(before)
            if span > 0:
                rate += (c.launches - before.launches) / span
                measured = True
            elif c.launches == before.launches:
                measured = measured or previous_scan is not None  # idle: counts as 0
        end = max(c.flushed_at for c in now.values())
        self._scanned[uid] = end
        stopped = bool(self._live.get(uid, frozenset()) - live)
        self._live[uid] = frozenset(live)
        return PodLaunches(
            rate=rate if measured else None,
            processes=len(now),
            peak_mem_mib=sum(c.peak_bytes for c in now.values()) / 2**20,
            live_mem_mib=sum(c.live_bytes for c in now.values()) / 2**20,
            end=end,
            steady=previous_scan is not None and bool(live) and not (started or stopped),
            configurations=launched,
            running_since=max((self._began[(uid, p)] for p in live), default=None),
        )

    def forget(self, uid: str) -> None:
        """Stop following a pod that left the node."""
        for key in [k for k in self._last if k[0] == uid]:
            del self._last[key]
            self._began.pop(key, None)
        self._scanned.pop(uid, None)
        self._live.pop(uid, None)

    def remove_directory(self, uid: str) -> None:
        """Delete a departed pod's directory under the host root (hostPath mode; the
        kubelet removes an emptyDir with its pod, and the agent mounts that read-only)."""
        self.forget(uid)
        if self.root is None or not _plain_uid(uid):
            return
        directory = self.root / uid
        if directory.is_symlink():
            directory.unlink()
        else:  # rmtree removes links inside without following them
            shutil.rmtree(directory, ignore_errors=True)
