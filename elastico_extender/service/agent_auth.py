"""Which node a node agent speaks for: its projected ServiceAccount token, reviewed.

With ``agent_auth: serviceaccount`` each agent sends the token the kubelet projects into
its pod (audience ``agent_token_audience``, rotated by the kubelet), and the extender asks
the API server who it is (``TokenReview``, ``authentication.k8s.io/v1``).  The review must
say: authenticated, for our audience, as the agents' ServiceAccount
(``system:serviceaccount:NS:NAME``).  The node then comes from the token's bound claims
in ``status.user.extra``: ``authentication.kubernetes.io/node-name`` (Kubernetes 1.30+),
else the bound pod (``pod-name`` and ``pod-uid``) looked up in the extender's watched
view, whose ``spec.nodeName`` it is.  So an agent reports only for its own node, and a
stolen token only for the node it was stolen from; one shared credential would let
any node forge every pod's windows.

Reviews are cached (bounded, keyed by a hash of the token, never the token) for
:data:`REVIEW_TTL_SECONDS` and never past the token's own ``exp``: one review per agent
per minute, not per report.  Refusals are not cached, so garbage cannot push out the
agents' entries.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elastico_extender.cluster.state import ClusterState
from elastico_extender.errors import ClusterError, RequestRefused

__all__ = [
    "NODE_NAME_KEY",
    "POD_NAME_KEY",
    "POD_UID_KEY",
    "AgentAuthenticator",
    "AgentRefused",
]

log = logging.getLogger(__name__)

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
REVIEW_TTL_SECONDS = 60.0
"""How long a review is trusted: a deleted agent pod's token stops working within this."""
MAX_REVIEWS = 8192
"""Reviews cached (one per agent and token; a token rotates every few minutes)."""
RETRY_AFTER_SECONDS = 5
_TOKEN = re.compile(r"[A-Za-z0-9_.\-]{1,8192}")
"""What a ServiceAccount token (a JWT) can be: anything else is refused unreviewed."""


class AgentRefused(RequestRefused):
    """The caller may not report: ``status`` 401 (not authenticated), 403 (not an agent,
    or not bound to a node) or 503 (cannot tell now: retry)."""


@dataclass(frozen=True, slots=True)
class _Bound:
    """What a successful review bound the token to: a node, or a pod to look up."""

    node: str | None
    pod: tuple[str, str, str] | None  # namespace, name, uid


class AgentAuthenticator:
    """Tokens to nodes through ``review(token, audiences) -> TokenReview status`` (the
    cluster's; raises :class:`ClusterError` when the API server cannot answer)."""

    def __init__(
        self,
        review: Callable[[str, list[str]], dict[str, Any]],
        state: ClusterState,
        *,
        audience: str,
        service_account: str,
        ttl: float = REVIEW_TTL_SECONDS,
        max_entries: int = MAX_REVIEWS,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.review = review
        self.state = state
        self.audience = audience
        namespace, _, name = service_account.partition(":")
        self.namespace = namespace
        self.username = f"system:serviceaccount:{namespace}:{name}"
        self.ttl = ttl
        self.max_entries = max_entries
        self.clock = clock
        self.wall = wall
        self.reviews = 0
        """Reviews asked of the API server (the rest came from the cache)."""
        self._cache: OrderedDict[bytes, tuple[float, _Bound]] = OrderedDict()
        self._lock = threading.Lock()
        self._down = False  # the API server's last answer failed (logged once per spell)

    def __len__(self) -> int:
        return len(self._cache)

    def node_of(self, token: str) -> str:
        """The node ``token``'s agent runs on, or :class:`AgentRefused`."""
        if not _TOKEN.fullmatch(token):
            raise AgentRefused(401, "the bearer token is not a ServiceAccount token")
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and cached[0] > now:
                self._cache.move_to_end(key)
                bound = cached[1]
            else:
                self._cache.pop(key, None)
                bound = None
        if bound is None:
            bound = self._review(token)
            until = now + min(self.ttl, _expiry(token, self.wall()))
            if until > now:
                with self._lock:
                    self._cache[key] = (until, bound)
                    while len(self._cache) > self.max_entries:
                        self._cache.popitem(last=False)
        return bound.node if bound.node is not None else self._node_of_pod(bound.pod)

    def _review(self, token: str) -> _Bound:
        """Ask the API server; refuse what it does not vouch for as an agent."""
        with self._lock:
            self.reviews += 1
        try:
            status = self.review(token, [self.audience])
        except ClusterError as exc:
            if not self._down:
                log.warning("agents.token_review_failed", extra={"error": str(exc)})
            self._down = True
            raise AgentRefused(
                503, f"cannot review the agent's token with the API server now ({exc}); retry"
            ) from None
        self._down = False
        if status.get("authenticated") is not True:
            why = str(status.get("error") or "not authenticated")[:200]
            raise AgentRefused(401, f"the API server did not authenticate the token: {why}")
        if self.audience not in (status.get("audiences") or ()):
            raise AgentRefused(401, f"the token is not for the audience {self.audience!r}")
        user = status.get("user") or {}
        username = user.get("username")
        if username != self.username:
            raise AgentRefused(
                403, f"{str(username)[:100]!r} is not the node agents' ServiceAccount"
            )
        extra = user.get("extra") or {}
        node = _single(extra, NODE_NAME_KEY)
        pod, uid = _single(extra, POD_NAME_KEY), _single(extra, POD_UID_KEY)
        if node is None and (pod is None or uid is None):
            raise AgentRefused(
                403, "the token is bound to no pod or node (mount a projected token)"
            )
        return _Bound(node, None if node is not None else (self.namespace, str(pod), str(uid)))

    def _node_of_pod(self, pod: tuple[str, str, str] | None) -> str:
        """The node of the agent's pod in the watched view (its uid must be the token's)."""
        assert pod is not None
        namespace, name, uid = pod
        obj = self.state.pod_by_name(namespace, name) or {}
        node = (obj.get("spec") or {}).get("nodeName")
        if (obj.get("metadata") or {}).get("uid") != uid or not node:
            raise AgentRefused(
                503, f"the agent's pod {namespace}/{name} is not in the extender's view yet; retry"
            )
        return str(node)


def _single(extra: Any, key: str) -> str | None:
    """The one non-empty value of ``extra[key]`` (a list of strings), else None."""
    values = extra.get(key) if isinstance(extra, dict) else None
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0] or None
    return None


def _expiry(token: str, now: float) -> float:
    """Seconds until the JWT's ``exp`` (the API server has just checked its signature),
    ``inf`` when the token does not say."""
    parts = token.split(".")
    if len(parts) != 3:
        return math.inf
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (ValueError, binascii.Error):
        return math.inf
    exp = claims.get("exp") if isinstance(claims, dict) else None
    if isinstance(exp, bool) or not isinstance(exp, int | float) or not math.isfinite(exp):
        return math.inf
    return float(exp) - now
