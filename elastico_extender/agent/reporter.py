"""POST a window's observations to the extender, authenticated like every state change.

Bearer token (the extender's ``--token-file`` Secret, mounted in the agent) and/or a
client certificate for the mTLS listener; the server certificate is checked against
``ca_file`` when given.  A 422 names the refused items: they are dropped and the rest is
sent once more, so one pod that just left does not cost the node's other windows.

A batch refused for a passing reason (a follower's 503 during a leader hand-over, 409
before the first plan, 429, a 401 while credentials roll out, another 5xx, or no answer
at all) is held, not dropped, and
resent with the next report, oldest first and one POST per held batch (a batch names a
pod once), after the server's ``Retry-After`` (capped at
:data:`RETRY_AFTER_CAP_SECONDS`; until then a report is held without posting).  What
the server took, or refused as bad input (any other 4xx), is never resent.  The hold is
bounded: at most ``max_held`` windows (the oldest dropped first), and a window older
than the extender's staleness bound is dropped, since the extender refuses it anyway.
``dropped`` counts both.

The bound is the extender's own: every answer to ``POST /observations`` states its
``observation_max_age_seconds`` in the ``Elastico-Observation-Max-Age`` header, and the
reporter holds windows until that bound less a margin for transit and clock skew
(:func:`hold_bound`: 10 s, or a tenth of a short bound).  A stated bound is clamped to
[:data:`MIN_STATED_SECONDS`, :data:`MAX_STATED_SECONDS`]; an answer without the header,
or with one that is not a positive finite number (an older extender, a proxy's own
answer), brings back the reporter's default, ``max_age_seconds``
(:data:`STALE_AFTER_SECONDS`, which suits the extender's default of 120 s).  So an
operator who changes the setting changes what agents resend, from their next answer on.
"""

from __future__ import annotations

import logging
import math
import ssl
import time
from collections import deque
from collections.abc import Callable
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from elastico_extender.agent import MAX_AGE_HEADER
from elastico_extender.bearer import BearerToken

__all__ = [
    "MAX_AGE_HEADER",
    "MAX_HELD_WINDOWS",
    "RETRY_AFTER_CAP_SECONDS",
    "STALE_AFTER_SECONDS",
    "Reporter",
    "hold_bound",
]

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_SECONDS = 30.0
"""Longest ``Retry-After`` honoured: a hand-over takes a Lease duration (15 s default)."""
STALE_AFTER_SECONDS = 110.0
"""A held window older than this is dropped until the extender states its bound: its
default ``observation_max_age_seconds`` (120 s) less the margin of :func:`hold_bound`."""
MIN_STATED_SECONDS = 1.0
MAX_STATED_SECONDS = 3600.0
"""Range a stated bound is clamped to: held windows are bounded in count anyway, this
keeps a wrong header from holding them for hours or dropping each at once."""
MARGIN_SECONDS = 10.0
"""Transit and clock skew between the agent's and the extender's clocks."""
MAX_HELD_WINDOWS = 4096
"""Windows held for resending (two batches of a node's every pod, with a wide margin)."""
TRANSIENT = frozenset({401, 409, 429})
"""4xx answers that say "not now" rather than "bad input".  401 is one: it judges the
credential, not the windows, and a credential comes right without the agent's help (a
``helm upgrade`` that rolls agents before the extender, a projected token the kubelet
is swapping, a Secret rotated on one side first)."""


def hold_bound(stated: str | None, default: float) -> float:
    """How long a refused window is held: the extender's stated bound (clamped) less the
    margin (10 s, at most a tenth of the bound); ``default`` when absent or garbage."""
    try:
        bound = float(stated) if stated is not None else math.nan
    except ValueError:
        bound = math.nan
    if not math.isfinite(bound) or bound <= 0:
        return default
    bound = min(max(bound, MIN_STATED_SECONDS), MAX_STATED_SECONDS)
    return bound - min(MARGIN_SECONDS, 0.1 * bound)


def _json_object(reply: httpx.Response) -> dict[str, Any] | None:
    """The reply's body when it is a JSON object (the extender's every answer), else None
    (a proxy's page, or JSON nested past the parser's limit: RecursionError)."""
    try:
        body = reply.json()
    except (ValueError, RecursionError):
        return None
    return body if isinstance(body, dict) else None


class Reporter:
    def __init__(
        self,
        url: str,
        *,
        token: str | BearerToken | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        max_held: int = MAX_HELD_WINDOWS,
        max_age_seconds: float = STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        # a token file is re-read when its Secret is rotated: each POST sends the newest
        self.token = BearerToken(token) if isinstance(token, str) else token
        context = ssl.create_default_context(cafile=ca_file)
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        self.client = httpx.Client(
            base_url=url.rstrip("/"),
            verify=context,
            timeout=timeout,
            transport=transport,
        )
        self.max_held = max_held
        self.default_max_age_seconds = max_age_seconds
        self.max_age_seconds = max_age_seconds
        """Held windows older than this are dropped: from the extender's last answer."""
        self.clock = clock
        self.retry_at = float("-inf")
        """No POST before this (the agent's clock): the server's capped ``Retry-After``;
        farther off than the cap only when the clock was stepped back, then forgotten."""
        self.dropped = 0
        """Held windows dropped: too many held, or too old to be taken."""
        self._held: deque[list[dict[str, Any]]] = deque()

    @property
    def held(self) -> int:
        """Windows waiting to be resent."""
        return sum(len(batch) for batch in self._held)

    def close(self) -> None:
        self.client.close()

    def send(self, node: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Post the held batches, then ``items`` (an empty batch too when nothing is held:
        it tells the extender the agent is alive); returns the extender's reply to the
        last POST (``accepted``, plus ``resent``: held windows posted first) or
        ``{"error": ...}`` with ``status`` and ``held`` when it was refused."""
        now = self.clock()
        self._expire(now)
        if self.retry_at - now > RETRY_AFTER_CAP_SECONDS:  # only a clock stepped back
            self.retry_at = float("-inf")
        if now < self.retry_at:
            self._hold(items)
            return {"deferred": True, "retry_in": self.retry_at - now, "held": self.held}
        batches = list(self._held)
        self._held.clear()
        resent = sum(len(batch) for batch in batches)
        if items or not batches:
            batches.append(items)
        result: dict[str, Any] = {}
        for k, batch in enumerate(batches):
            result, keep = self._post(node, batch)
            if keep is not None:
                for rest in [keep, *batches[k + 1 :]]:
                    self._hold(rest)
                return {**result, "held": self.held}
        return {**result, "resent": resent} if resent else result

    def _post(
        self, node: str, items: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], list[dict[str, Any]] | None]:
        """One batch: the reply, and the items to hold (None: taken or not to resend)."""
        for attempt in (0, 1):
            try:
                reply = self.client.post(
                    "/observations",
                    json={"node": node, "observations": items},
                    headers={"Authorization": f"Bearer {self.token.current()}"}
                    if self.token is not None
                    else None,
                )
            except httpx.HTTPError as exc:
                log.warning("report.failed", extra={"error": str(exc), "held": len(items)})
                return {"error": str(exc)}, items
            self._adopt(reply.headers.get(MAX_AGE_HEADER))
            answer = _json_object(reply)
            if reply.status_code == 200:
                if answer is not None:
                    return answer, None
                # taken (the status says so), but not the extender's answer: a proxy's
                unread = {"error": f"reply is not a JSON object: {reply.text[:200]!r}"}
                log.warning("report.unreadable_reply", extra=unread)
                return {**unread, "status": 200}, None
            if answer is None:
                answer = {"Error": reply.text[:200]}
            failed = {"error": answer.get("Error"), "status": reply.status_code}
            if reply.status_code in TRANSIENT or reply.status_code >= 500:
                self._wait(reply.headers.get("Retry-After"))
                log.warning("report.held", extra={**failed, "windows": len(items)})
                return failed, items
            named = answer.get("refused")
            refused = set(named) if isinstance(named, list) else set()
            log.warning("report.refused", extra=failed)
            if reply.status_code != 422 or not refused or attempt:
                return failed, None
            items = [item for i, item in enumerate(items) if i not in refused]
            if not items:
                return failed, None
        return {"error": "unreachable"}, None

    def _adopt(self, stated: str | None) -> None:
        """Hold windows as long as the extender that answered takes them (module doc)."""
        bound = hold_bound(stated, self.default_max_age_seconds)
        if bound != self.max_age_seconds:
            log.info(
                "report.max_age",
                extra={"stated": stated, "held_for_seconds": bound, "was": self.max_age_seconds},
            )
            self.max_age_seconds = bound

    def _wait(self, header: str | None) -> None:
        """Honour ``Retry-After`` (delta seconds or an HTTP date), capped."""
        if not header:
            return
        try:
            delay = float(header)
        except ValueError:
            try:
                delay = parsedate_to_datetime(header).timestamp() - time.time()
            except (TypeError, ValueError):
                return
        if math.isfinite(delay) and delay > 0:
            self.retry_at = self.clock() + min(delay, RETRY_AFTER_CAP_SECONDS)

    def _hold(self, items: list[dict[str, Any]]) -> None:
        if items:
            self._held.append(list(items))
        excess = self.held - self.max_held
        while excess > 0:
            oldest = self._held[0]
            cut = min(excess, len(oldest))
            del oldest[:cut]
            excess -= cut
            self._drop(cut, "too many held")
            if not oldest:
                self._held.popleft()

    def _expire(self, now: float) -> None:
        for batch in list(self._held):
            fresh = [i for i in batch if now - float(i.get("end", now)) <= self.max_age_seconds]
            if len(fresh) < len(batch):
                self._drop(len(batch) - len(fresh), "stale")
                batch[:] = fresh
        self._held = deque(batch for batch in self._held if batch)

    def _drop(self, count: int, why: str) -> None:
        self.dropped += count
        log.warning("report.dropped", extra={"windows": count, "why": why, "total": self.dropped})
