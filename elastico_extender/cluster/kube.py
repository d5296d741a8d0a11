"""The real cluster through the official ``kubernetes`` client: list + watch, and bind.

One thread per resource (nodes, pods) runs the informer loop kube-scheduler's
own cache follows:

1. **list** (``resourceVersion`` of the list remembered), replacing the view;
2. **watch** from that version with bookmarks; each event replaces one object;
   a normal end of the watch (server timeout) resumes from the last version, after a
   back-off when it ended within a second and brought no event (a "very short watch");
3. **relist** on ``410 Gone`` (an ERROR event or status), on a dropped or broken
   stream, on a stalled one, and every ``resync_seconds`` (periodic resync).

A stalled watch is a connection that stays open and brings nothing: a proxy or load
balancer that lost its upstream half-way keeps the client's socket alive, and a quiet
watch on a healthy API server looks the same from the client.  Each watch therefore asks
the API server to end it after ``watch_timeout_seconds`` (``timeoutSeconds``, which
kube-apiserver honours, default 60 s) and reads with a timeout of that plus
``watch_grace_seconds`` (default 15 s): a healthy server has ended the stream by then,
so a silent socket past it is a dead one, dropped and replaced by a relist.  A stall is
noticed within ``watch_timeout_seconds + watch_grace_seconds`` (75 s by default; before,
only by the 270 s read timeout of a 240 s watch).

Objects are kept as raw JSON dicts (``_preload_content=False``, and a watch whose
events are left undecoded, :class:`_RawWatch`): the extender reads a few fields and
never pays for the client's model classes.  Bind writes, in order: the per-pod ConfigMap (owned by
the pod), then the ``v1 Binding`` carrying the decision annotations (the API
server puts them on the pod with its node, in one write).
"""

from __future__ import annotations

import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from urllib3.exceptions import ReadTimeoutError

from elastico_extender import __version__
from elastico_extender.cluster.base import BindRequest, ClusterError
from elastico_extender.cluster.embedded import configmap_object
from elastico_extender.cluster.state import ClusterState
from elastico_extender.userfiles import YamlError, parse_yaml, read_text, reason

__all__ = ["FIELD_MANAGER", "USER_AGENT", "KubeCluster", "api_client_from"]

log = logging.getLogger(__name__)

HTTP_GONE = 410
HTTP_NOT_FOUND = 404
SHORT_WATCH_SECONDS = 1.0
"""A watch that ends cleanly sooner than this with no event is a "very short watch" (as
client-go's reflector calls it): the API server or a proxy closing streams at once. The
next one waits a back-off, instead of reopening watches as fast as the connection allows."""
WATCH_TIMEOUT_SECONDS = 60
"""Default ``timeoutSeconds`` of one watch: the API server ends it then and the informer
resumes from the last version (a cheap request; no relist).  Short, because only a
stream's end proves the connection alive (see the module doc)."""
WATCH_GRACE_SECONDS = 15.0
"""Default time a watch may stay silent past its ``timeoutSeconds`` before the client
gives up on the connection (the read timeout is the sum): room for a busy API server to
send its closing chunk, short enough to bound how long a stalled stream goes unnoticed."""
CONNECT_TIMEOUT_SECONDS = 10.0
"""Longest wait for the TCP (and TLS) connection of a list or watch."""
WRITE_TIMEOUT_SECONDS = 30.0
"""Longest wait for the API server's answer to one write (bind, reconfigure, evict): one
that accepts and never answers fails the write as "outcome unknown" instead of holding
the caller (a verb's handler, the booking's write lock) for ever."""
READ_TIMEOUT_SECONDS = 5.0
"""Longest wait for one object read (a pod's ConfigMap, read back by the epoch thread when
a pod lost its decision annotations): a slow API server delays one epoch by this much."""
REVIEW_TIMEOUT_SECONDS = 5.0
"""Longest wait for a TokenReview: a node agent's report waits on it (its own timeout is
10 s) and is answered 503, to be retried, when the API server does not answer in time."""

FIELD_MANAGER = "elastico-extender"
"""Every write passes it as ``fieldManager``: managedFields and audit logs name ElastiCo."""
USER_AGENT = f"{FIELD_MANAGER}/{__version__} (scheduler extender; python kubernetes client)"


MAX_KUBECONFIG_BYTES = 4 << 20
"""Largest kubeconfig read (a few KiB usually; embedded certificates add some)."""
_KUBECONFIG_LISTS = ("clusters", "contexts", "users")


def api_client_from(kubeconfig: str | None) -> client.ApiClient:
    """In-cluster config when running in a pod and no kubeconfig is given.

    A kubeconfig is checked first (a regular file of at most ``MAX_KUBECONFIG_BYTES``,
    YAML whose top level is a mapping and whose clusters, contexts and users are lists),
    so a wrong file is a ValueError that says what is wrong with it: the client's own
    loader hung on a FIFO and raised TypeError or a YAML parser's traceback for text
    that is no kubeconfig."""
    if not kubeconfig:
        config.load_incluster_config()
        return client.ApiClient()
    check_kubeconfig(kubeconfig)
    try:
        return config.new_client_from_config(config_file=kubeconfig)
    except config.ConfigException:
        raise
    except (TypeError, AttributeError, KeyError, IndexError) as exc:  # a shape it trusted
        raise ValueError(f"{kubeconfig}: not a usable kubeconfig ({exc})") from None


def check_kubeconfig(path: str) -> None:
    """ValueError naming what is wrong when ``path`` is no kubeconfig (see above)."""
    try:
        document = parse_yaml(read_text(path, MAX_KUBECONFIG_BYTES))
    except OSError as exc:
        raise ValueError(f"{path}: {reason(exc)}") from None
    except YamlError as exc:
        where = f" at line {exc.line}" if exc.line is not None else ""
        raise ValueError(f"{path}: not YAML{where}, so not a kubeconfig") from None
    if not isinstance(document, dict):
        raise ValueError(f"{path}: a kubeconfig is a YAML mapping (apiVersion, clusters, ...)")
    for name in _KUBECONFIG_LISTS:
        if document.get(name) is not None and not isinstance(document[name], list):
            raise ValueError(f"{path}: {name} must be a list")


class _RawWatch(watch.Watch):
    """Watch events as plain dicts, never the client's model classes.

    Not the client's ``deserialize=False``: that path skips the ``raw_object`` its own
    ERROR handling reads, so a ``410 Gone`` on the stream came out as a KeyError (logged
    as a dropped connection, relisted after a back-off) instead of an ApiException."""

    def unmarshal_event(self, data: str, return_type: Any) -> dict[str, Any] | None:
        if not data or data.isspace():
            return None  # a blank line between events
        event: dict[str, Any] = json.loads(data)  # not JSON: a broken stream, relisted
        event["raw_object"] = event["object"]  # what the client's ERROR handling reads
        return event


class _Informer:
    def __init__(
        self,
        kind: str,
        state: ClusterState,
        list_call: Callable[..., Any],
        stop: threading.Event,
        resync_seconds: float,
        watch_timeout: int,
        on_relist: Callable[[str, str], None],
        watch_grace: float = WATCH_GRACE_SECONDS,
    ) -> None:
        self.kind = kind
        self.state = state
        self.list_call = list_call
        self.stop = stop
        self.resync_seconds = resync_seconds
        self.watch_timeout = watch_timeout
        self.watch_grace = watch_grace
        self.on_relist = on_relist
        self.watcher: _RawWatch | None = None
        self.relists = 0

    def relist(self) -> str:
        resp = self.list_call(_preload_content=False, _request_timeout=60)
        doc = json.loads(resp.data)
        rv = str((doc.get("metadata") or {}).get("resourceVersion", ""))
        self.state.replace(self.kind, doc.get("items") or [], rv)
        self.relists += 1
        return rv

    def run(self) -> None:
        backoff = 0.2
        rv = ""
        listed_at = 0.0
        while not self.stop.is_set():
            try:
                if not rv or time.monotonic() - listed_at >= self.resync_seconds:
                    rv = self.relist()
                    listed_at = time.monotonic()
                    self.on_relist(self.kind, rv)
                remaining = self.resync_seconds - (time.monotonic() - listed_at)
                opened = time.monotonic()
                rv, events = self._watch(rv, max(1, min(self.watch_timeout, int(remaining) + 1)))
                if events or time.monotonic() - opened >= SHORT_WATCH_SECONDS:
                    backoff = 0.2
                elif not self.stop.is_set():  # resumed from rv after the wait: nothing lost
                    log.warning("watch.short", extra={"kind": self.kind, "rv": rv})
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
            except ApiException as exc:
                if exc.status == HTTP_GONE:
                    log.info("watch.gone", extra={"kind": self.kind, "rv": rv})
                else:
                    log.warning("watch.api_error", extra={"kind": self.kind, "status": exc.status})
                    self._sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                rv = ""  # relist
            except Exception as exc:  # dropped or stalled connection, protocol error: relist
                if self.stop.is_set():
                    break
                if _read_timed_out(exc):
                    # Open but silent past its timeoutSeconds: a dead connection (module doc).
                    log.warning(
                        "watch.stalled",
                        extra={"kind": self.kind, "rv": rv,
                               "silent_s": self.watch_timeout + self.watch_grace},
                    )  # fmt: skip
                else:
                    log.warning("watch.dropped", extra={"kind": self.kind, "error": repr(exc)})
                self._sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                rv = ""

    def _sleep(self, seconds: float) -> None:
        self.stop.wait(seconds * (0.5 + random.random()))

    def _watch(self, rv: str, timeout: int) -> tuple[str, int]:
        """One watch from ``rv``: the version to resume from and how many events came."""
        w = _RawWatch()
        self.watcher = w
        events = 0
        try:
            for event in w.stream(
                self.list_call,
                resource_version=rv,
                timeout_seconds=timeout,
                allow_watch_bookmarks=True,
                # (connect, read): the read timeout is per socket read, so a stream silent
                # for longer than its own timeoutSeconds plus the grace is given up on.
                _request_timeout=(CONNECT_TIMEOUT_SECONDS, timeout + self.watch_grace),
            ):
                if event is None:
                    continue  # a blank line
                events += 1
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "BOOKMARK":
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                    self.state.set_resource_version(self.kind, rv)
                elif kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.state.apply(self.kind, kind, obj)
                    rv = str((obj.get("metadata") or {}).get("resourceVersion", rv))
                if self.stop.is_set():
                    break
        finally:
            self.watcher = None
        return rv, events


def _read_timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps: urllib3 raises a ProtocolError around the socket
    timeout of a chunked read) is a read timeout."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ReadTimeoutError | TimeoutError):
            return True
        if any(isinstance(arg, ReadTimeoutError | TimeoutError) for arg in current.args):
            return True
        current = current.__cause__ or current.__context__
    return False


STATUS_MESSAGE_CHARS = 300
"""Most of an API server's Status message kept in a ClusterError (the reply to a verb)."""


def _status_message(body: Any) -> str:
    """The ``message`` of the Status an API server answered (why a write was refused:
    "already assigned to node ...", "Precondition failed: UID ..."), cut to
    :data:`STATUS_MESSAGE_CHARS`; '' when the body is no Status."""
    try:
        doc = json.loads(body) if isinstance(body, (str, bytes)) else None
    except ValueError:
        return ""
    said = doc.get("message") if isinstance(doc, dict) else None
    if not isinstance(said, str):
        return ""
    said = " ".join(said.split())
    return said if len(said) <= STATUS_MESSAGE_CHARS else said[: STATUS_MESSAGE_CHARS - 3] + "..."


@contextmanager
def _as_cluster_error(known: Mapping[int, str] | None = None) -> Iterator[None]:
    """Any failure of the API writes inside as :class:`ClusterError`: the message
    ``known`` gives for the status, else the status and reason the API server
    answered with its Status message, or why it could not be reached."""
    try:
        yield
    except ApiException as exc:
        message = (known or {}).get(exc.status)
        if message is None:
            message = f"API server answered {exc.status}: {exc.reason}"
            said = _status_message(exc.body)
            if said:
                message += f" ({said})"
        raise ClusterError(message, status=exc.status) from exc
    except Exception as exc:  # urllib3 connection errors and the like: outcome unknown
        raise ClusterError(f"API server unreachable: {exc}") from exc


class KubeCluster:
    """A :class:`~.base.Cluster` backed by a Kubernetes API server."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        resync_seconds: float = 300.0,
        watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS,
        watch_grace_seconds: float = WATCH_GRACE_SECONDS,
        description: str | None = None,
    ) -> None:
        """``watch_timeout_seconds`` is each watch's ``timeoutSeconds``; a watch silent
        ``watch_grace_seconds`` longer is taken for a dead connection and replaced by a
        relist (module doc)."""
        if watch_timeout_seconds < 1 or not 0 < watch_grace_seconds < math.inf:
            raise ValueError(
                "watch_timeout_seconds must be >= 1 and watch_grace_seconds a finite "
                f"number > 0, got {watch_timeout_seconds} and {watch_grace_seconds}"
            )
        api_client.user_agent = USER_AGENT  # instead of the client's OpenAPI-Generator/...
        self.api = client.CoreV1Api(api_client)
        self.state = ClusterState()
        host = api_client.configuration.host
        self.description = description or f"Kubernetes API server at {host}"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.relists: dict[str, int] = {"nodes": 0, "pods": 0}
        self.may_write: Callable[[str], None] = lambda what: None
        """Called before the second write of a bind or reconfiguration; raises to stop it
        (the leader gate: a claim may run out while the first write takes its time)."""
        self.informers = {
            "nodes": _Informer(
                "nodes", self.state, self.api.list_node, self._stop, resync_seconds,
                watch_timeout_seconds, self._count, watch_grace_seconds,
            ),
            "pods": _Informer(
                "pods", self.state, self.api.list_pod_for_all_namespaces, self._stop,
                resync_seconds, watch_timeout_seconds, self._count, watch_grace_seconds,
            ),
        }  # fmt: skip

    def _count(self, kind: str, rv: str) -> None:
        self.relists[kind] += 1
        log.info("cluster.relist", extra={"kind": kind, "rv": rv})

    def start(self) -> None:
        self._stop.clear()
        for kind, informer in self.informers.items():
            thread = threading.Thread(target=informer.run, name=f"watch-{kind}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.state.is_synced:
                return True
            time.sleep(0.02)
        return self.state.is_synced

    def stop(self) -> None:
        self._stop.set()
        for informer in self.informers.values():
            if informer.watcher is not None:
                informer.watcher.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()

    def bind(self, request: BindRequest) -> None:
        """Two writes: the ConfigMap, then the Binding carrying the decision annotations.

        The API server copies a Binding's ``metadata.annotations`` onto the pod in
        the same write that sets its node, so a pod is never bound without its
        decision, whatever stops between the writes (a ConfigMap without a bound
        pod is harmless: owned by the pod, replaced by the next bind)."""
        self._write_configmap(request)
        self.may_write("bind")
        ns, name = request.namespace, request.name
        binding: Any = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": ns, "uid": request.uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": request.node},
        }
        if request.annotations:
            binding["metadata"]["annotations"] = dict(request.annotations)
        try:
            with _as_cluster_error():
                # _preload_content=False: the client's Binding model rejects the Status reply.
                self.api.create_namespaced_pod_binding(
                    name,
                    ns,
                    binding,
                    field_manager=FIELD_MANAGER,
                    _preload_content=False,
                    _request_timeout=WRITE_TIMEOUT_SECONDS,
                )
        except ClusterError as exc:
            if exc.status != 409 or not self._bound_as_asked(request):
                raise

    def _bound_as_asked(self, request: BindRequest) -> bool:
        """Whether the pod (``request.uid``) is bound to ``request.node`` with the
        decision: a Binding of ours that landed though its answer was lost, so a retry
        got 409.  False when that cannot be read."""
        try:
            reply: Any = self.api.read_namespaced_pod(
                request.name,
                request.namespace,
                _preload_content=False,
                _request_timeout=WRITE_TIMEOUT_SECONDS,
            )
            pod = json.loads(reply.data)
        except Exception:  # no answer, or no pod: the 409 stands
            return False
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        notes = meta.get("annotations") or {}
        return (
            (not request.uid or meta.get("uid") == request.uid)
            and spec.get("nodeName") == request.node
            and all(notes.get(k) == v for k, v in request.annotations.items())
        )

    def reconfigure(self, request: BindRequest) -> None:
        self._write_decision(request)

    def read_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap ``namespace/name`` as JSON, or None when the API server has none
        (404); ClusterError when it cannot answer (see :class:`~.base.ConfigMapReader`)."""
        try:
            with _as_cluster_error():
                reply: Any = self.api.read_namespaced_config_map(
                    name, namespace, _preload_content=False, _request_timeout=READ_TIMEOUT_SECONDS
                )
                doc = json.loads(reply.data)
        except ClusterError as exc:
            if exc.status == HTTP_NOT_FOUND:
                return None
            raise
        return doc if isinstance(doc, dict) else None

    def review_token(self, token: str, audiences: list[str]) -> dict[str, Any]:
        """The API server's ``TokenReview`` status of ``token`` for ``audiences`` (who it
        authenticates, ``authentication.k8s.io/v1``); ClusterError when it cannot answer."""
        review: Any = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": audiences},
        }
        with _as_cluster_error():
            reply: Any = client.AuthenticationV1Api(self.api.api_client).create_token_review(
                review, _preload_content=False, _request_timeout=REVIEW_TIMEOUT_SECONDS
            )
            doc = json.loads(reply.data)
        status = doc.get("status") if isinstance(doc, dict) else None
        return status if isinstance(status, dict) else {}

    def evict(self, namespace: str, name: str, uid: str) -> None:
        eviction: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}},  # never a same-named successor
        }
        refused = (
            f"eviction of {namespace}/{name} refused: a PodDisruptionBudget allows "
            "no disruption now"
        )
        with _as_cluster_error({429: refused}):
            self.api.create_namespaced_pod_eviction(
                name,
                namespace,
                eviction,
                field_manager=FIELD_MANAGER,
                _preload_content=False,
                _request_timeout=WRITE_TIMEOUT_SECONDS,
            )

    def _write_decision(self, request: BindRequest) -> None:
        """ConfigMap first (the webhook's env refers to it), then the pod's annotations,
        only on the pod with ``request.uid``."""
        self._write_configmap(request)
        if request.annotations:
            self.may_write("reconfigure")
            meta: dict[str, Any] = {"annotations": request.annotations}
            if request.uid:
                # A precondition, as the garbage collector's patches carry it: the UID is
                # immutable, so a same-named successor (a StatefulSet pod recreated since
                # the view was read) refuses the patch instead of taking our decision.
                meta["uid"] = request.uid
            with _as_cluster_error():
                self.api.patch_namespaced_pod(
                    request.name,
                    request.namespace,
                    {"metadata": meta},
                    _preload_content=False,
                    _request_timeout=WRITE_TIMEOUT_SECONDS,
                )

    def _write_configmap(self, request: BindRequest) -> None:
        """The per-pod ConfigMap of framework settings: created, or replaced if it exists."""
        ns = request.namespace
        with _as_cluster_error():
            if request.configmap is not None:
                body: Any = configmap_object(request, request.uid)
                try:
                    self.api.create_namespaced_config_map(
                        ns,
                        body,
                        field_manager=FIELD_MANAGER,
                        _preload_content=False,
                        _request_timeout=WRITE_TIMEOUT_SECONDS,
                    )
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                    self.api.replace_namespaced_config_map(
                        request.configmap,
                        ns,
                        body,
                        field_manager=FIELD_MANAGER,
                        _preload_content=False,
                        _request_timeout=WRITE_TIMEOUT_SECONDS,
                    )
