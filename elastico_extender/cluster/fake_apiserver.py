"""A small Kubernetes API server that speaks the real list/watch protocol (STYLE habit 12).

It serves, over real HTTP/1.1 on 127.0.0.1:

* ``GET /api/v1/nodes``, ``GET /api/v1/pods``: lists with ``metadata.resourceVersion``;
  ``GET /api/v1/nodes/{name}`` and ``GET .../namespaces/{ns}/pods/{name}``: the object,
  or a ``404 NotFound`` Status;
* the same with ``?watch=true&resourceVersion=N``: a chunked stream of JSON
  watch events (ADDED / MODIFIED / DELETED / BOOKMARK) after N, held open until
  ``timeoutSeconds``; a version older than the last compaction gets an
  ``ERROR`` event carrying a ``410 Expired`` Status, as etcd compaction causes;
* ``POST .../pods/{name}/binding`` (the Binding's ``metadata.annotations`` are
  copied onto the pod with its node, as kube-apiserver's binding registry does;
  409 when already bound, or when its ``metadata.uid`` is not the pod's),
  ``PATCH .../pods/{name}`` (merge patch of its labels and annotations; 422 for a
  ``metadata.uid`` other than the pod's, which is immutable),
  ``POST``/``PUT``/``GET``/``DELETE .../configmaps``: the writes bind performs and the learned-state
  checkpoint (each write assigns a ``resourceVersion``; a ``PUT`` carrying a stale one
  gets ``409 Conflict``, to a missing object ``404``);
* ``POST .../pods/{name}/eviction`` (policy/v1 Eviction): the pod gets the
  ``DisruptionTarget`` condition and a ``deletionTimestamp`` (MODIFIED) and is then
  deleted, or ``429`` while :attr:`disruptions_allowed` is 0 (a PodDisruptionBudget
  says no).

* ``POST /apis/authentication.k8s.io/v1/tokenreviews``: a ``TokenReview`` answered as
  kube-apiserver answers it (201; ``status.authenticated``, ``user`` with ``extra``, the
  audiences in common), for the tokens :meth:`issue_token` made (a ServiceAccount token
  with its audiences, expiry and bound-object claims; :meth:`revoke_token` ends one);
* ``GET .../services/[SCHEME:]NAME[:PORT]/proxy/PATH[?QUERY]``: the service proxy,
  relayed with its query to the URL registered in :attr:`services`, or to each of a list
  of URLs in turn (the endpoints of a Service: the API server picks one per request);
  ``kubectl elastico`` reaches the extender this way;
* every other kind (Leases, Events, the Helm chart's objects): create, read, list,
  replace with ``resourceVersion`` preconditions, merge patch and delete, from
  :class:`~.fake_objects.ObjectStore` (``self.store``).

Test hooks: :meth:`compact` (older versions expire), :meth:`drop_watches`
(cut every open stream mid-chunk, as a dying load balancer would),
:meth:`bookmark`, :attr:`watch_limit_seconds` (streams closed early, cleanly),
:attr:`stall_watches` (streams held open in silence, past their ``timeoutSeconds``),
:attr:`write_delay` (each write waits, as an etcd commit does),
:attr:`write_fault` (answer a write with an error instead of applying it),
:attr:`before_reply` (act between a write and its answer).
The official ``kubernetes`` client talks to it unchanged.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from elastico_extender.cluster.fake_objects import ObjectStore, merge_patch

__all__ = ["FakeApiServer"]

_POD = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)(/binding|/eviction)?$")
_PROXY = re.compile(r"^/api/v1/namespaces/([^/]+)/services/([^/]+)/proxy(/.*)?$")
_CM = re.compile(r"^/api/v1/namespaces/([^/]+)/configmaps(?:/([^/]+))?$")
_NODE = re.compile(r"^/api/v1/nodes/([^/]+)$")
_KINDS = {"pods": "Pod", "nodes": "Node"}
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
API_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
"""The API server's own audience: a TokenReview without ``spec.audiences`` checks this."""


class _Server(ThreadingHTTPServer):
    """A client hanging up mid-response (a dropped watch) is routine for an API server,
    not an error worth a traceback on stderr; anything else is still reported."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FakeApiServer:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}}
        self.events: dict[str, list[tuple[int, str, dict[str, Any]]]] = {"nodes": [], "pods": []}
        self.compacted = 0
        self.drops = 0
        self.configmaps: dict[tuple[str, str], dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.evictions: list[dict[str, Any]] = []
        self.disruptions_allowed = 1_000_000  # evictions granted before answering 429
        self.requests: list[str] = []
        # Writes as the real API server attributes them: method, resource kind (the
        # last path segment of a collection or subresource), field manager, User-Agent.
        self.writes: list[dict[str, str]] = []
        self.watch_count = {"nodes": 0, "pods": 0}  # watches opened (and droppable)
        self.store = ObjectStore(self._next_rv)
        # (namespace, name) -> base URL, or the base URLs of its endpoints
        self.services: dict[tuple[str, str], str | list[str]] = {}
        self._proxied = 0  # requests relayed: the next endpoint of a list
        # token -> (its audiences, its expiry (wall clock), the UserInfo a review returns)
        self.tokens: dict[str, tuple[list[str], float, dict[str, Any]]] = {}
        self.token_reviews = 0
        self.write_delay = 0.0  # seconds each write takes (a real server's etcd commit)
        # Each watch ends cleanly (the chunked stream's last chunk) after at most this many
        # seconds, whatever its timeoutSeconds: an API server shutting down, or a proxy in
        # front of it, closing streams early (0: at once, before any event).
        self.watch_limit_seconds: float | None = None
        # While set, every watch stream (open ones included) sends nothing more and never
        # ends, whatever its timeoutSeconds: a connection left half-dead by a proxy or a
        # load balancer, which the client can only notice by its own read timeout.  Cleared,
        # the streams still open go on as before.
        self.stall_watches = False
        # Called with (method, path) once a write was applied, before it is answered: a
        # test acts in that gap (another client reads, the writer's clock moves on) as
        # for a writer paused or a slow network back.
        self.before_reply: Callable[[str, str], None] | None = None
        # Called with (method, path) before a write is applied: a (status, Status body)
        # it returns is the answer instead and nothing is written (a 429 from priority
        # and fairness, a 503 while etcd is away); None lets the write through.
        self.write_fault: Callable[[str, str], tuple[int, dict[str, Any]] | None] | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                outer._get(self)

            def do_POST(self) -> None:
                outer._write(self, "POST")

            def do_PATCH(self) -> None:
                outer._write(self, "PATCH")

            def do_PUT(self) -> None:
                outer._write(self, "PUT")

            def do_DELETE(self) -> None:
                outer._write(self, "DELETE")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- lifecycle -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.drops += 1
            self.cond.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _next_rv(self) -> int:
        with self.cond:
            self.rv += 1
            return self.rv

    # -- world changes -----------------------------------------------------------
    @staticmethod
    def key(kind: str, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return (
            meta["name"]
            if kind == "nodes"
            else f"{meta.get('namespace', 'default')}/{meta['name']}"
        )

    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object (ADDED or MODIFIED event)."""
        with self.cond:
            self.rv += 1
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(self.rv)
            if kind == "pods":
                meta.setdefault("namespace", "default")
                meta.setdefault("uid", f"uid-{meta['name']}")
            key = self.key(kind, obj)
            event = "MODIFIED" if key in self.objects[kind] else "ADDED"
            self.objects[kind][key] = obj
            self.events[kind].append((self.rv, event, obj))
            self.cond.notify_all()
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self.cond:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.events[kind].append((self.rv, "DELETED", obj))
            self.cond.notify_all()

    def bookmark(self, kind: str) -> None:
        with self.cond:
            self.rv += 1
            marker = {"kind": "Pod" if kind == "pods" else "Node", "apiVersion": "v1",
                      "metadata": {"resourceVersion": str(self.rv)}}  # fmt: skip
            self.events[kind].append((self.rv, "BOOKMARK", marker))
            self.cond.notify_all()

    def compact(self) -> None:
        """Every version up to now expires: a watch from it gets 410 Gone."""
        with self.cond:
            self.compacted = self.rv
            self.cond.notify_all()

    def drop_watches(self) -> None:
        """Cut every open watch stream without a proper end."""
        with self.cond:
            self.drops += 1
            self.cond.notify_all()

    def issue_token(
        self,
        username: str,
        audiences: list[str],
        extra: dict[str, list[str]] | None = None,
        expires_in: float = 600.0,
    ) -> str:
        """A token as the TokenRequest API makes for a projected volume: a JWT whose claims
        carry ``aud`` and ``exp`` (unsigned here: only this server's reviews trust it),
        authenticated as ``username`` with ``extra`` (the bound-object claims) until it
        expires or :meth:`revoke_token`."""
        now = time.time()

        def part(doc: dict[str, Any]) -> str:
            return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()

        claims = {"aud": audiences, "exp": int(now + expires_in), "iat": int(now),
                  "sub": username, "jti": secrets.token_hex(8)}  # fmt: skip
        token = f"{part({'alg': 'RS256'})}.{part(claims)}.{secrets.token_urlsafe(32)}"
        groups = ["system:serviceaccounts", "system:authenticated"]
        user: dict[str, Any] = {"username": username, "uid": f"uid-{username}", "groups": groups}
        if extra:
            user["extra"] = {k: list(v) for k, v in extra.items()}
        with self.cond:
            self.tokens[token] = (list(audiences), now + expires_in, user)
        return token

    def revoke_token(self, token: str) -> None:
        """The token no longer authenticates (its pod was deleted, say)."""
        with self.cond:
            self.tokens.pop(token, None)

    # -- HTTP ------------------------------------------------------------------------
    def _send_json(self, handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        if self.before_reply is not None and handler.command != "GET":
            self.before_reply(handler.command, urlparse(handler.path).path)
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _get(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlparse(handler.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.requests.append(handler.path)
        proxied = _PROXY.match(unquote(url.path))
        if proxied:
            ns, service, path = proxied.groups()
            self._proxy(handler, ns, service, path, url.query)
            return
        cm = _CM.match(url.path)
        if cm and cm.group(2):
            with self.cond:
                found = copy.deepcopy(self.configmaps.get(cm.groups()))  # type: ignore[arg-type]
            if found is None:
                missing = _status(404, "NotFound", f'configmaps "{cm.group(2)}" not found')
                self._send_json(handler, 404, missing)
            else:
                self._send_json(handler, 200, {"kind": "ConfigMap", "apiVersion": "v1", **found})
            return
        pod, node = _POD.match(url.path), _NODE.match(url.path)
        if pod and not pod.group(3):
            self._get_one(handler, "pods", pod.group(1), pod.group(2))
            return
        if node:
            self._get_one(handler, "nodes", node.group(1))
            return
        kind = {"/api/v1/nodes": "nodes", "/api/v1/pods": "pods"}.get(url.path)
        if kind is None:
            answer = self.store.handle("GET", url.path, None)
            status, body = answer or (404, {"kind": "Status", "code": 404, "message": "not found"})
            self._send_json(handler, status, body)
            return
        if query.get("watch") in ("true", "1", "True"):
            self._watch(handler, kind, query)
            return
        with self.cond:
            items = [copy.deepcopy(o) for o in self.objects[kind].values()]
            rv = self.rv
        list_kind = "NodeList" if kind == "nodes" else "PodList"
        self._send_json(
            handler,
            200,
            {"kind": list_kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(rv)},
             "items": items},
        )  # fmt: skip

    def _get_one(
        self, handler: BaseHTTPRequestHandler, kind: str, first: str, name: str | None = None
    ) -> None:
        """``GET .../pods/{name}`` or ``/api/v1/nodes/{name}``: the object, or the
        API server's 404 NotFound Status naming it."""
        key = first if kind == "nodes" else f"{first}/{name}"
        with self.cond:
            found = copy.deepcopy(self.objects[kind].get(key))
        if found is None:
            missing = _status(404, "NotFound", f'{kind} "{name or first}" not found')
            missing["details"] = {"name": name or first, "kind": kind}
            self._send_json(handler, 404, missing)
            return
        self._send_json(handler, 200, {"kind": _KINDS[kind], "apiVersion": "v1", **found})

    def _proxy(
        self, handler: BaseHTTPRequestHandler, ns: str, service: str, path: str | None, query: str
    ) -> None:
        name = service.split(":")[1] if service.count(":") >= 1 else service
        base = self.services.get((ns, name))
        if isinstance(base, list):
            with self.cond:
                base, self._proxied = base[self._proxied % len(base)], self._proxied + 1
        if base is None:
            self._send_json(handler, 404, {"kind": "Status", "code": 404,
                                           "message": f'services "{name}" not found'})  # fmt: skip
            return
        try:
            target = base + (path or "/") + (f"?{query}" if query else "")
            with urllib.request.urlopen(target, timeout=30) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _chunk(self, handler: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        handler.wfile.flush()

    def _watch(self, handler: BaseHTTPRequestHandler, kind: str, query: dict[str, str]) -> None:
        since = int(query.get("resourceVersion") or 0)
        timeout = float(query.get("timeoutSeconds") or 30)
        started = time.monotonic()
        deadline = started + timeout
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        with self.cond:
            drops = self.drops
            # Counted only now: a test that sees the count knows a drop will reach this watch.
            self.watch_count[kind] += 1
        try:
            if since < self.compacted:
                self._chunk(handler, {"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": f"too old resource version: {since} ({self.compacted})",
                    "reason": "Expired", "code": 410}})  # fmt: skip
                handler.wfile.write(b"0\r\n\r\n")
                return
            sent = since
            while True:
                limit = self.watch_limit_seconds  # read each time: it applies to open streams
                if limit is not None:
                    deadline = min(deadline, started + limit)
                stalled = self.stall_watches  # the same: a stream can go silent mid-way
                with self.cond:
                    pending = [] if stalled else [e for e in self.events[kind] if e[0] > sent]
                    if not pending and self.drops == drops:
                        wait = 0.2 if stalled else min(0.2, deadline - time.monotonic())
                        self.cond.wait(max(0.0, wait))
                        if not stalled:
                            pending = [e for e in self.events[kind] if e[0] > sent]
                    dropped = self.drops != drops
                if dropped:
                    handler.wfile.write(b'7f\r\n{"type": "MOD')  # half a chunk, then cut
                    handler.wfile.flush()
                    handler.connection.shutdown(socket.SHUT_RDWR)
                    handler.close_connection = True
                    return
                for rv, etype, obj in pending:
                    self._chunk(handler, {"type": etype, "object": obj})
                    sent = rv
                if not stalled and time.monotonic() >= deadline:
                    handler.wfile.write(b"0\r\n\r\n")
                    return
        except (BrokenPipeError, ConnectionResetError, OSError):
            handler.close_connection = True

    def _configmap_write(
        self,
        method: str,
        where: tuple[str, str | None],
        body: dict[str, Any],
        managed: list[dict[str, Any]],
    ) -> tuple[int, dict[str, Any]]:
        """Create (409 AlreadyExists) or replace (404 NotFound; 409 Conflict when the body's
        ``metadata.resourceVersion`` is not the stored one, an unconditional update
        without one), assigning a new ``resourceVersion`` as kube-apiserver does."""
        ns, name = where
        meta = body.get("metadata") if isinstance(body, dict) else None
        if not isinstance(meta, dict) or not (name or meta.get("name")):
            return 422, _status(422, "Invalid", "metadata.name: Required value")
        key = (ns, str(name or meta["name"]))
        with self.cond:
            current = self.configmaps.get(key)
            if method == "POST" and current is not None:
                return 409, _status(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
            if method == "PUT":
                if current is None:
                    return 404, _status(404, "NotFound", f'configmaps "{key[1]}" not found')
                wanted = meta.get("resourceVersion")
                if wanted and wanted != current["metadata"].get("resourceVersion"):
                    return 409, _status(409, "Conflict", (
                        f'Operation cannot be fulfilled on configmaps "{key[1]}": the object '
                        "has been modified; please apply your changes to the latest version "
                        "and try again"))  # fmt: skip
            self.rv += 1
            stored = copy.deepcopy(body)
            meta = stored["metadata"]
            meta.update(name=key[1], namespace=ns, resourceVersion=str(self.rv),
                        managedFields=managed)  # fmt: skip
            meta["uid"] = (current or {}).get("metadata", {}).get("uid") or f"uid-cm-{self.rv}"
            self.configmaps[key] = stored
            return (201 if method == "POST" else 200), copy.deepcopy(stored)

    def _write(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        try:
            body = json.loads(handler.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send_json(handler, 400, {"kind": "Status", "code": 400, "message": "bad JSON"})
            return
        url = urlparse(handler.path)
        path = url.path
        self.requests.append(f"{method} {path}")
        if path == TOKEN_REVIEWS and method == "POST":
            self._token_review(handler, body)
            return
        if self.write_delay:
            time.sleep(self.write_delay)
        fault = self.write_fault(method, path) if self.write_fault is not None else None
        if fault is not None:
            self._send_json(handler, *fault)
            return
        agent = handler.headers.get("User-Agent") or ""
        # kube-apiserver: the fieldManager parameter, else the User-Agent's product name.
        manager = (parse_qs(url.query).get("fieldManager") or [agent.split("/")[0]])[0]
        parts = path.rstrip("/").split("/")
        kind = parts[-1] if parts[-1] in ("binding", "eviction", "configmaps") else parts[-2]
        self.writes.append({"method": method, "kind": kind, "manager": manager,
                            "user_agent": agent})  # fmt: skip
        managed = [{"manager": manager, "operation": "Update", "apiVersion": "v1"}]
        pod = _POD.match(path)
        cm = _CM.match(path)
        if pod:
            ns, name, binding = pod.groups()
            with self.cond:
                current = self.objects["pods"].get(f"{ns}/{name}")
            if current is None:
                self._send_json(handler, 404, {"kind": "Status", "code": 404,
                                               "message": f"pods {name!r} not found"})  # fmt: skip
                return
            updated = copy.deepcopy(current)
            if binding == "/eviction" and method == "POST":
                refused = {"kind": "Status", "code": 429, "reason": "TooManyRequests",
                           "message": "Cannot evict pod as it would violate the pod's "
                           "disruption budget."}  # fmt: skip
                if self.disruptions_allowed <= 0:
                    self._send_json(handler, 429, refused)
                    return
                wanted = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
                if wanted and wanted != current["metadata"].get("uid"):
                    conflict = {"kind": "Status", "code": 409, "message": "UID precondition failed"}
                    self._send_json(handler, 409, conflict)
                    return
                self.disruptions_allowed -= 1
                self.evictions.append(body)
                # As a real API server (1.31+) does: the pod first gets the DisruptionTarget
                # condition (a Job's podFailurePolicy reads it) and a deletionTimestamp
                # (graceful termination), then goes once its grace period is over (here at
                # once).
                self.put("pods", evicting(updated))
                self.delete("pods", f"{ns}/{name}")
                self._send_json(handler, 201, {"kind": "Status", "status": "Success", "code": 201})
                return
            if binding and method == "POST":
                wanted = (body.get("metadata") or {}).get("uid")
                uid = current["metadata"].get("uid")
                if wanted and wanted != uid:  # kube-apiserver's UID precondition
                    self._send_json(handler, 409, _status(409, "Conflict", (
                        f'Operation cannot be fulfilled on pods/binding "{name}": '
                        f"Precondition failed: UID in precondition: {wanted}, "
                        f"UID in object meta: {uid}")))  # fmt: skip
                    return
                if updated["spec"].get("nodeName"):
                    assigned = updated["spec"]["nodeName"]
                    self._send_json(handler, 409, {"kind": "Status", "code": 409,
                                                   "reason": "Conflict",
                                                   "message": f"pod {name} is already assigned "
                                                   f"to node \"{assigned}\""})  # fmt: skip
                    return
                updated["spec"]["nodeName"] = body["target"]["name"]
                # As the real registry does: the Binding's own annotations land on the pod
                # in the same write as its node.
                anns = (body.get("metadata") or {}).get("annotations") or {}
                if anns:
                    updated["metadata"].setdefault("annotations", {}).update(anns)
                _manage(updated, managed)
                self.bindings.append(body)
                self.put("pods", updated)
                self._send_json(handler, 201, {"kind": "Status", "status": "Success", "code": 201})
                return
            if method == "PATCH":  # merge patch of labels and annotations (null: removed)
                patch = body.get("metadata") or {}
                uid = current["metadata"].get("uid")
                if patch.get("uid") not in (None, uid):
                    # as kube-apiserver: a patch may not change the UID (immutable), so
                    # one carrying another pod's UID changes nothing
                    self._send_json(handler, 422, _status(422, "Invalid", (
                        f'Pod "{name}" is invalid: metadata.uid: Invalid value: '
                        f'"{patch["uid"]}": field is immutable')))  # fmt: skip
                    return
                for field in ("annotations", "labels"):
                    if isinstance(patch.get(field), dict):
                        merged = merge_patch(updated["metadata"].get(field) or {}, patch[field])
                        updated["metadata"][field] = merged
                _manage(updated, managed)
                self._send_json(handler, 200, self.put("pods", updated))
                return
        if cm and method in ("POST", "PUT"):
            status, reply = self._configmap_write(method, (cm[1], cm[2]), body, managed)
            self._send_json(handler, status, reply)
            return
        if cm and method == "DELETE" and cm[2]:
            with self.cond:
                gone = self.configmaps.pop((cm[1], cm[2]), None)
            if gone is None:
                missing = _status(404, "NotFound", f'configmaps "{cm[2]}" not found')
                self._send_json(handler, 404, missing)
            else:  # as kube-apiserver answers a delete with immediate effect
                self._send_json(handler, 200, _status(200, "", "deleted") | {"status": "Success"})
            return
        answer = self.store.handle(method, path, body)
        status, reply = answer or (404, {"kind": "Status", "code": 404, "message": "not found"})
        self._send_json(handler, status, reply)

    def _token_review(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        """Authenticate ``spec.token`` for ``spec.audiences`` (default: the API server's
        own); the reply is the review with its ``status``, 201 either way."""
        spec = body.get("spec") if isinstance(body, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        token = spec.get("token")
        if not isinstance(token, str) or not token:
            message = "token is required for TokenReview in authentication"
            self._send_json(handler, 400, _status(400, "BadRequest", message))
            return
        wanted = spec.get("audiences") or [API_AUDIENCE]
        with self.cond:
            self.token_reviews += 1
            known = self.tokens.get(token)
        status: dict[str, Any] = {"user": {}}  # authenticated: false is omitted, as there
        if known is None:
            status["error"] = "[invalid bearer token, token lookup failed]"
        else:
            audiences, expiry, user = known
            common = [a for a in wanted if a in audiences]
            if time.time() >= expiry:
                status["error"] = "[invalid bearer token, token has expired]"
            elif not common:
                status["error"] = (
                    f"[invalid bearer token, token audiences {json.dumps(audiences)} is "
                    f"invalid for the target audiences {json.dumps(wanted)}]"
                )
            else:
                status = {"authenticated": True, "user": copy.deepcopy(user), "audiences": common}
        review = {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        self._send_json(handler, 201, review)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "message": message, "code": code}  # fmt: skip


def _manage(obj: dict[str, Any], managed: list[dict[str, Any]]) -> None:
    """Record a write in managedFields: one entry per manager, as the API server keeps."""
    mine = {m["manager"] for m in managed}
    kept = [m for m in obj["metadata"].get("managedFields") or () if m.get("manager") not in mine]
    obj["metadata"]["managedFields"] = kept + managed


def evicting(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the Eviction subresource leaves it before its deletion completes."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = pod.setdefault("status", {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
    conditions.append({"type": "DisruptionTarget", "status": "True",
                       "reason": "EvictionByEvictionAPI",
                       "message": "Eviction API: evicting", "lastTransitionTime": now})  # fmt: skip
    status["conditions"] = conditions
    pod["metadata"]["deletionTimestamp"] = now
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    return pod
