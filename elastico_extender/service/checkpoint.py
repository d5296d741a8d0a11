"""The leader's checkpoint of what the closed loop learned, in the API server (issue 11).

Each extender replica keeps the loop's state in a pod-local SQLite file, and only the
leader learns (followers refuse agents' windows).  So that a new leader, or a cluster
restarted from nothing, starts from what the cluster learned, the leader checkpoints a
bounded snapshot (:mod:`elastico_extender.profiles.loop_snapshot`) to one ConfigMap,
``elastico-learned`` by default, in the extender's namespace, the way Kubernetes-native
controllers keep their state without shared storage:

* **what**: the loop's learned state (``observations``) and, when given, the completed
  jobs' run times (``completions``, :mod:`elastico_extender.service.completions`) and
  the jobs of evicted pods awaiting or taken over by a replacement (``succession``,
  :mod:`elastico_extender.service.succession`);
* **write** every ``period`` seconds (30 s by default) while leading and the learned
  state changed, and once more at a clean shutdown (before the Lease is released):
  ``binaryData["learned.zlib"]`` (at most ``max_bytes``, 768 KiB by default, well under
  the 1 MiB object limit; the oldest rows dropped first, and the annotation
  ``elastico.io/learned-dropped`` says how many per section);
* **optimistic concurrency**: each write is a ``PUT`` conditional on the
  ``resourceVersion`` this replica last read or wrote, so a write that did not see the
  newest checkpoint gets ``409 Conflict`` and changes nothing.  On a conflict the replica
  reads the newest checkpoint: written under a newer term (``elastico.io/learned-term``:
  the Lease's ``leaseTransitions`` when its writer won it, or one more than the term of
  the checkpoint it restored, whichever is larger) means this replica was deposed, and
  it stops writing; otherwise (an older leader's last write landing late) it merges it
  and writes again;
* **restore** at start and whenever this replica becomes the leader (before it leads):
  the checkpoint is merged into the replica's state and its SQLite file.  A checkpoint
  that cannot be read (garbage, another format, too large) is ignored with a warning,
  never a crash: the replica goes on with what it has, and its next write replaces it;
* **refresh** while following, every ``period`` seconds: a follower reads the ConfigMap
  and merges it when its ``resourceVersion`` changed since the one it last merged (an
  unchanged one is not decoded), so its plans and REST views use what the leader learned
  and a takeover starts from the newest checkpoint (the restore then finds nothing new to
  decode).  A follower never writes; the leader never reads its own checkpoint back;
* **status** (:meth:`LearnedCheckpoint.status`, ``GET /healthz``) and Prometheus series
  (:class:`CheckpointCollector`): the age of this replica's last sync with the
  checkpoint, the failures by reason (:data:`FAILURE_REASONS`), the payload's size.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elastico_extender.cluster.kube import FIELD_MANAGER
from elastico_extender.profiles.loop_snapshot import (
    CorruptSnapshot,
    LearnedState,
    NewerSnapshot,
    decode,
    encode,
)
from elastico_extender.service.completions import CompletionRecorder
from elastico_extender.service.observations import ObservationService
from elastico_extender.service.succession import Succession

__all__ = ["DATA_KEY", "FAILURE_REASONS", "CheckpointCollector", "LearnedCheckpoint"]

log = logging.getLogger(__name__)

DATA_KEY = "learned.zlib"
TERM = "elastico.io/learned-term"
WRITER = "elastico.io/learned-writer"
KEPT = "elastico.io/learned-kept"
DROPPED = "elastico.io/learned-dropped"
TIMEOUT = 5.0
"""Seconds per API call: the restore runs inside the Lease's on_started hook, which must
return well within the renew deadline (10 s with the chart's defaults)."""
HISTORY_ROWS = 5_000
"""Newest labelled samples, per-pod records and completed jobs offered to a checkpoint
(before the bound): 5,000 completions estimate run times about as well as the book's
50,000 and take about 160 KiB."""
FAILURE_REASONS = (
    "unreachable",
    "api_error",
    "conflict",
    "deposed",
    "unreadable",
    "newer_format",
)
"""Why a read or write failed (the metric's bounded label set): no answer from the API
server; an error status from it (RBAC, quota, ...); a write refused as not conditional
on the newest checkpoint; a newer leader's checkpoint seen (this replica stops writing);
a stored checkpoint this version cannot decode; one of a newer ElastiCo's format (kept:
this replica does not write over it until it is gone or readable)."""


class LearnedCheckpoint:
    """One replica's side of the checkpoint (module doc); ``start`` runs the writer."""

    def __init__(
        self,
        api_client: client.ApiClient,
        observations: ObservationService,
        *,
        namespace: str,
        name: str = "elastico-learned",
        is_leader: Callable[[], bool] = lambda: True,
        term: Callable[[], int] = lambda: 0,
        identity: str = "",
        period: float = 30.0,
        max_bytes: int = 768 << 10,
        completions: CompletionRecorder | None = None,
        succession: Succession | None = None,
    ) -> None:
        self.api = client.CoreV1Api(api_client)
        self.observations = observations
        self.completions = completions
        self.succession = succession
        self.namespace = namespace
        self.name = name
        self.is_leader = is_leader
        self.term = term
        self.identity = identity
        self.period = period
        self.max_bytes = max_bytes
        self._rv: str | None = None  # the resourceVersion last read or written here
        self._written_version = -1  # self._version() when last written
        self._deposed_term: int | None = None  # a newer term's checkpoint was seen
        self._floor = 0  # 1 + the term of the checkpoint last restored
        self._merged_rv: str | None = None  # whose state this replica holds (no decode)
        self._unreadable_rv: str | None = None  # counted once, not every period
        self._newer = False  # the stored checkpoint is a newer version's: do not write
        self.last_dropped: dict[str, int] = {}
        self.writes = 0
        self.merges = 0
        """Checkpoints decoded and merged (restore, refresh, after a conflict)."""
        self.reads = 0
        """Successful reads of the ConfigMap (found or absent)."""
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.last_failure: dict[str, Any] | None = None
        self.payload_bytes: int | None = None
        """Compressed size of the checkpoint last written or read here."""
        self._started = time.monotonic()
        self._synced: float | None = None  # monotonic: last write/check, restore/refresh
        self.last_write_at: float | None = None  # wall clock, for the status
        self.last_read_at: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- restore and refresh ------------------------------------------------------------
    def restore(self) -> bool:
        """Merge the stored checkpoint into this replica; False when there is none usable."""
        with self._lock:
            return self._restore()

    def _restore(self) -> bool:
        found = self._fetch()
        if found is None:
            return False
        obj, rv = found
        if obj is None:
            self._synced_now()  # nothing stored: nothing to restore
            self._newer = False
            return False
        self._rv = rv
        # Write above what was restored: a Lease created anew (transitions from 0) must
        # not look older than the checkpoint of the Lease before it.
        self._floor = _term_of(obj) + 1
        self._deposed_term = None
        # Refreshed while following: "unchanged", nothing new to decode.
        return self._take(obj, rv, "checkpoint.restored") != "unreadable"

    def refresh(self) -> str:
        """A follower's periodic read: merge the checkpoint if its ``resourceVersion``
        changed since the one this replica holds.  Never writes, and the leader never
        reads back its own checkpoint.  Returns ``leader``, ``absent``, ``unchanged``,
        ``merged``, ``unreadable`` or ``failed``."""
        with self._lock:
            if self.is_leader():
                return "leader"
            found = self._fetch()
            if found is None:
                return "failed"
            obj, rv = found
            if obj is None:
                self._synced_now()
                self._newer = False
                return "absent"
            return self._take(obj, rv, "checkpoint.refreshed")

    def _take(self, obj: dict[str, Any], rv: str | None, event: str) -> str:
        """Merge the checkpoint ``obj`` unless this replica holds it already: ``unchanged``
        (its version is the one last merged or written here), ``unreadable`` (it cannot be
        decoded; a version found unreadable is not decoded again: the leader's next write
        replaces it) or ``merged`` (logged as ``event``)."""
        if rv is not None and rv == self._merged_rv:
            self._synced_now()
            return "unchanged"
        if rv is not None and rv == self._unreadable_rv:
            return "unreadable"
        state = self._decoded(obj, rv)
        if state is None:
            return "unreadable"
        self.observations.merge_learned(state)
        if self.completions is not None:
            self.completions.merge(state.completions)
        if self.succession is not None:
            self.succession.merge(state.succession)
        self._merged(rv)
        log.info(
            event,
            extra={
                "configmap": f"{self.namespace}/{self.name}",
                "resource_version": rv,
                "rows": state.counts(),
            },
        )
        return "merged"

    def _fetch(self) -> tuple[dict[str, Any] | None, str | None] | None:
        """(the ConfigMap, its resourceVersion); (None, None) when there is none; None when
        it could not be read (counted as a failure)."""
        try:
            reply: Any = self.api.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
            obj = json.loads(reply.data)
        except ApiException as exc:
            if exc.status == 404:
                self._read_ok(None)
                return None, None
            self._failed("api_error", "read", f"HTTP {exc.status}")
            return None
        except ValueError as exc:  # not JSON: not an API server we can talk to
            self._failed("unreachable", "read", f"not JSON ({exc})")
            return None
        except Exception as exc:  # unreachable: the next period tries again
            self._failed("unreachable", "read", repr(exc))
            return None
        if not isinstance(obj, dict):
            self._failed("unreachable", "read", f"a JSON {type(obj).__name__}, not an object")
            return None
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        self._read_ok(obj)
        return obj, rv

    def _decoded(self, obj: dict[str, Any], rv: str | None) -> LearnedState | None:
        """The checkpoint's state; None when it cannot be read (warned and counted once
        per resourceVersion)."""
        data = (obj.get("binaryData") or {}) if isinstance(obj.get("binaryData"), dict) else {}
        encoded = data.get(DATA_KEY)
        where = f"{self.namespace}/{self.name}"
        if not isinstance(encoded, str):
            self._unreadable(rv, "no binaryData entry", {"configmap": where, "key": DATA_KEY})
            return None
        try:
            payload = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            reason = {"configmap": where, "reason": str(exc)}
            self._unreadable(rv, "binaryData is not base64", reason)
            return None
        self.payload_bytes = len(payload)
        try:
            state = decode(payload)
        except NewerSnapshot as exc:
            self._newer = True
            self._unreadable(
                rv,
                f"{exc}: kept; this replica does not write over it "
                "(delete the ConfigMap to start it afresh with this version)",
                {"configmap": where, "reason": str(exc)},
                reason="newer_format",
            )
            return None
        except CorruptSnapshot as exc:
            self._unreadable(
                rv,
                "ignored, this replica keeps its own state and its next write replaces it",
                {"configmap": where, "reason": str(exc)},
            )
            return None
        self._newer = False
        return state

    def _unreadable(
        self, rv: str | None, why: str, extra: dict[str, Any], reason: str = "unreadable"
    ) -> None:
        """Warn that the stored checkpoint cannot be read; counted once per version."""
        log.warning(f"checkpoint.{reason}: {why}", extra=extra)
        if rv is None or rv != self._unreadable_rv:
            self._failed(reason, "read", why)
        self._unreadable_rv = rv

    # -- write --------------------------------------------------------------------------
    def save(self, force: bool = False) -> str:
        """Write the checkpoint if leading and something changed; returns what happened:
        ``written``, ``unchanged``, ``follower``, ``deposed``, ``newer`` (a newer
        version's checkpoint is stored: kept), ``conflict`` or ``failed``."""
        with self._lock:
            if not self.is_leader():
                return "follower"
            if self._newer:
                return "newer"
            term = max(self.term(), self._floor)
            if self._deposed_term is not None and self._deposed_term > term:
                return "deposed"
            self._deposed_term = None
            version = self._version()
            if not force and version == self._written_version:
                self._synced_now()  # the stored checkpoint holds all this replica knows
                return "unchanged"
            for attempt in (0, 1):
                outcome = self._write(term)
                if outcome != "conflict":
                    if outcome == "written":
                        self._written_version = version
                    return outcome
                if attempt or not self._newest_is_older(term):
                    return "deposed" if self._deposed_term is not None else "conflict"
            return "conflict"

    def _version(self) -> int:
        """Grows whenever the loop, the completions or the succession changed (the counters
        only grow, so their sum changes exactly when one of them does)."""
        learned = self.completions.version if self.completions is not None else 0
        handed = self.succession.version if self.succession is not None else 0
        return self.observations.learned_version + learned + handed

    def _write(self, term: int) -> str:
        state = self.observations.learned_state(HISTORY_ROWS)
        if self.completions is not None:
            state.completions = self.completions.rows(HISTORY_ROWS)
        if self.succession is not None:
            state.succession = self.succession.rows()
        payload, kept, dropped = encode(state, self.max_bytes)
        if any(dropped.values()):
            log.info("checkpoint.trimmed", extra={"kept": kept, "dropped": dropped})
        self.last_dropped = dropped
        meta: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {
                "app.kubernetes.io/component": "learned-state",
                "app.kubernetes.io/managed-by": FIELD_MANAGER,
            },
            "annotations": {
                TERM: str(term),
                WRITER: self.identity,
                KEPT: json.dumps(kept, separators=(",", ":")),
                DROPPED: json.dumps(dropped, separators=(",", ":")),
            },
        }
        body: Any = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "binaryData": {DATA_KEY: base64.b64encode(payload).decode()},
        }
        reply: Any
        try:
            if self._rv is None:
                reply = self.api.create_namespaced_config_map(
                    self.namespace, body, field_manager=FIELD_MANAGER, _preload_content=False,
                    _request_timeout=TIMEOUT,
                )  # fmt: skip
            else:
                meta["resourceVersion"] = self._rv
                reply = self.api.replace_namespaced_config_map(
                    self.name, self.namespace, body, field_manager=FIELD_MANAGER,
                    _preload_content=False, _request_timeout=TIMEOUT,
                )  # fmt: skip
            written = json.loads(reply.data)
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted, or written since we read it
                log.warning(
                    "checkpoint.conflict: a newer checkpoint exists; not overwritten",
                    extra={"status": exc.status, "resource_version": self._rv},
                )
                self._failed("conflict", "write", f"HTTP {exc.status}")
                return "conflict"
            self._failed("api_error", "write", f"HTTP {exc.status}")
            return "failed"
        except Exception as exc:  # unreachable: the next period tries again
            self._failed("unreachable", "write", repr(exc))
            return "failed"
        self._rv = str(written.get("metadata", {}).get("resourceVersion") or "") or None
        self._merged_rv = self._rv  # this replica holds what it wrote: nothing to read back
        self.writes += 1
        self.payload_bytes = len(payload)
        self.last_write_at = time.time()
        self._synced_now()
        log.info("checkpoint.written", extra={"bytes": len(payload), "term": term})
        return "written"

    def _newest_is_older(self, term: int) -> bool:
        """After a conflict: read the newest checkpoint.  Written under a newer term: we are
        deposed (False).  Else merge it (an older leader's late write) and True: retry."""
        found = self._fetch()
        if found is None:
            return False  # unreadable: counted; the next period tries again
        obj, rv = found
        if obj is None:
            self._rv = None  # deleted: the retry creates it
            return True
        theirs = _term_of(obj)
        if theirs > term:
            self._deposed_term = theirs
            self._failed("deposed", "write", f"term {theirs} > {term}")
            log.warning(
                "checkpoint.deposed: a newer leader wrote the checkpoint; this replica stops",
                extra={"term": term, "newer_term": theirs},
            )
            return False
        self._rv = rv
        self._take(obj, rv, "checkpoint.merged_newer")
        return True

    # -- bookkeeping, status ------------------------------------------------------------
    def _read_ok(self, obj: dict[str, Any] | None) -> None:
        self.reads += 1
        self.last_read_at = time.time()
        if obj is None:
            self.payload_bytes = None

    def _merged(self, rv: str | None) -> None:
        self._merged_rv = rv
        self.merges += 1
        self._synced_now()

    def _synced_now(self) -> None:
        self._synced = time.monotonic()

    def _failed(self, reason: str, operation: str, detail: str) -> None:
        self.failures[reason] += 1
        self.last_failure = {
            "reason": reason,
            "operation": operation,
            "detail": detail[:200],
            "at": time.time(),
        }
        if reason in ("unreachable", "api_error"):
            log.warning(f"checkpoint.{operation}_failed", extra={"reason": reason, "error": detail})

    def age_seconds(self) -> float:
        """Seconds since this replica last knew it agrees with the stored checkpoint: the
        leader's last write (or last check that nothing new was learned since), a
        follower's last restore or refresh read; since start when never."""
        synced = self._synced if self._synced is not None else self._started
        return max(0.0, time.monotonic() - synced)

    def status(self) -> dict[str, Any]:
        """What ``GET /healthz`` shows of the checkpoint (and the metrics read)."""
        return {
            "configmap": f"{self.namespace}/{self.name}",
            "role": "leader" if self.is_leader() else "follower",
            "age_seconds": round(self.age_seconds(), 3),
            "synced": self._synced is not None,
            "bytes": self.payload_bytes,
            "resource_version": self._merged_rv or self._rv,
            "last_write_at": self.last_write_at,
            "last_read_at": self.last_read_at,
            "writes": self.writes,
            "reads": self.reads,
            "merges": self.merges,
            "failures": dict(self.failures),
            "last_failure": self.last_failure,
            "period_seconds": self.period,
        }

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="learned-checkpoint", daemon=True)
        self._thread.start()

    def step(self) -> str:
        """One period: the leader writes (if it learned something), a follower refreshes."""
        outcome = self.save()
        return self.refresh() if outcome == "follower" else outcome

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.step()
            except Exception:  # the writer must outlive any one failed write
                log.exception("checkpoint.step_failed")

    def stop(self, final: bool = True) -> None:
        """Stop the writer; with ``final``, write once more while still leading."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if final:
            started = time.monotonic()
            outcome = self.save()
            log.info(
                "checkpoint.final",
                extra={"outcome": outcome, "seconds": round(time.monotonic() - started, 3)},
            )


class CheckpointCollector(Collector):
    """Prometheus series of the checkpoint, read at scrape time.

    ===============================================  =======  ==============================
    metric                                           type     labels
    ===============================================  =======  ==============================
    elastico_learned_checkpoint_age_seconds          gauge    (since the last sync)
    elastico_learned_checkpoint_bytes                gauge    (compressed payload)
    elastico_learned_checkpoint_failures_total       counter  reason (FAILURE_REASONS)
    ===============================================  =======  ==============================
    """

    def __init__(self, checkpoint: LearnedCheckpoint) -> None:
        self.checkpoint = checkpoint

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        cp = self.checkpoint
        yield GaugeMetricFamily(
            "elastico_learned_checkpoint_age_seconds",
            "Seconds since this replica last agreed with the learned-state checkpoint (the "
            "leader's last write or check, a follower's last restore or refresh)",
            value=cp.age_seconds(),
        )
        if cp.payload_bytes is not None:
            yield GaugeMetricFamily(
                "elastico_learned_checkpoint_bytes",
                "Compressed size of the learned-state checkpoint last written or read",
                value=cp.payload_bytes,
            )
        failures = CounterMetricFamily(
            "elastico_learned_checkpoint_failures_total",
            "Failed reads and writes of the learned-state checkpoint, by reason",
            labels=["reason"],
        )
        for reason, count in cp.failures.items():
            failures.add_metric([reason], count)
        yield failures


def _term_of(obj: dict[str, Any]) -> int:
    """The Lease term a checkpoint was written under (0 when absent or unreadable)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    try:
        return max(0, int(str(annotations.get(TERM, "0"))))
    except ValueError:
        return 0
