"""The leader's checkpoint of what the closed loop learned, in the API server (issue 11).

Each extender replica keeps the loop's state in a pod-local SQLite file, and only the
leader learns (followers refuse agents' windows).  So that a new leader, or a cluster
restarted from nothing, starts from what the cluster learned, the leader checkpoints a
bounded snapshot (:mod:`elastico_extender.profiles.loop_snapshot`) to one ConfigMap,
``elastico-learned`` by default, in the extender's namespace, the way Kubernetes-native
controllers keep their state without shared storage:

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
  never a crash: the replica goes on with what it has, and its next write replaces it.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from elastico_extender.cluster.kube import FIELD_MANAGER
from elastico_extender.profiles.loop_snapshot import CorruptSnapshot, decode, encode
from elastico_extender.service.observations import ObservationService

__all__ = ["DATA_KEY", "LearnedCheckpoint"]

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
"""Newest labelled samples and per-pod records offered to a checkpoint (before the bound)."""


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
    ) -> None:
        self.api = client.CoreV1Api(api_client)
        self.observations = observations
        self.namespace = namespace
        self.name = name
        self.is_leader = is_leader
        self.term = term
        self.identity = identity
        self.period = period
        self.max_bytes = max_bytes
        self._rv: str | None = None  # the resourceVersion last read or written here
        self._written_version = -1  # observations.learned_version when last written
        self._deposed_term: int | None = None  # a newer term's checkpoint was seen
        self._floor = 0  # 1 + the term of the checkpoint last restored
        self.last_dropped: dict[str, int] = {}
        self.writes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- restore ------------------------------------------------------------------------
    def restore(self) -> bool:
        """Merge the stored checkpoint into this replica; False when there is none usable."""
        with self._lock:
            return self._restore()

    def _restore(self) -> bool:
        found = self._read()
        if found is None:
            return False
        obj, payload = found
        self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        # Write above what was restored: a Lease created anew (transitions from 0) must
        # not look older than the checkpoint of the Lease before it.
        self._floor = _term_of(obj) + 1
        self._deposed_term = None
        if payload is None:
            return False
        try:
            state = decode(payload)
        except CorruptSnapshot as exc:
            log.warning(
                "checkpoint.unreadable: ignored, this replica keeps its own state and its "
                "next write replaces it",
                extra={"configmap": f"{self.namespace}/{self.name}", "reason": str(exc)},
            )
            return False
        self.observations.merge_learned(state)
        log.info(
            "checkpoint.restored",
            extra={"configmap": f"{self.namespace}/{self.name}", "rows": state.counts()},
        )
        return True

    def _read(self) -> tuple[dict[str, Any], bytes | None] | None:
        """(the ConfigMap, its payload or None when unreadable); None when absent/unreachable."""
        try:
            reply: Any = self.api.read_namespaced_config_map(
                self.name, self.namespace, _preload_content=False, _request_timeout=TIMEOUT
            )
            obj = json.loads(reply.data)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("checkpoint.read_failed", extra={"status": exc.status})
            return None
        except Exception as exc:  # unreachable, or not JSON: the same as nothing to read
            log.warning("checkpoint.read_failed", extra={"error": repr(exc)})
            return None
        if not isinstance(obj, dict):
            return None
        data = (obj.get("binaryData") or {}) if isinstance(obj.get("binaryData"), dict) else {}
        encoded = data.get(DATA_KEY)
        if not isinstance(encoded, str):
            log.warning(
                "checkpoint.unreadable: no binaryData entry",
                extra={"configmap": f"{self.namespace}/{self.name}", "key": DATA_KEY},
            )
            return obj, None
        try:
            return obj, base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as exc:
            log.warning(
                "checkpoint.unreadable: binaryData is not base64",
                extra={"configmap": f"{self.namespace}/{self.name}", "reason": str(exc)},
            )
            return obj, None

    # -- write --------------------------------------------------------------------------
    def save(self, force: bool = False) -> str:
        """Write the checkpoint if leading and something changed; returns what happened:
        ``written``, ``unchanged``, ``follower``, ``deposed``, ``conflict`` or ``failed``."""
        with self._lock:
            if not self.is_leader():
                return "follower"
            term = max(self.term(), self._floor)
            if self._deposed_term is not None and self._deposed_term > term:
                return "deposed"
            self._deposed_term = None
            version = self.observations.learned_version
            if not force and version == self._written_version:
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

    def _write(self, term: int) -> str:
        state = self.observations.learned_state(HISTORY_ROWS)
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
                return "conflict"
            log.warning("checkpoint.write_failed", extra={"status": exc.status})
            return "failed"
        except Exception as exc:  # unreachable: the next period tries again
            log.warning("checkpoint.write_failed", extra={"error": repr(exc)})
            return "failed"
        self._rv = str(written.get("metadata", {}).get("resourceVersion") or "") or None
        self.writes += 1
        log.info("checkpoint.written", extra={"bytes": len(payload), "term": term})
        return "written"

    def _newest_is_older(self, term: int) -> bool:
        """After a conflict: read the newest checkpoint.  Written under a newer term: we are
        deposed (False).  Else merge it (an older leader's late write) and True: retry."""
        found = self._read()
        if found is None:
            self._rv = None  # deleted: the retry creates it
            return True
        obj, payload = found
        theirs = _term_of(obj)
        if theirs > term:
            self._deposed_term = theirs
            log.warning(
                "checkpoint.deposed: a newer leader wrote the checkpoint; this replica stops",
                extra={"term": term, "newer_term": theirs},
            )
            return False
        self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None
        if payload is not None:
            try:
                self.observations.merge_learned(decode(payload))
            except CorruptSnapshot as exc:
                log.warning("checkpoint.unreadable", extra={"reason": str(exc)})
        return True

    # -- lifecycle ----------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="learned-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.save()
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


def _term_of(obj: dict[str, Any]) -> int:
    """The Lease term a checkpoint was written under (0 when absent or unreadable)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    try:
        return max(0, int(str(annotations.get(TERM, "0"))))
    except ValueError:
        return 0
