"""POST a window's observations to the extender, authenticated like every state change.

Bearer token (the extender's ``--token-file`` Secret, mounted in the agent) and/or a
client certificate for the mTLS listener; the server certificate is checked against
``ca_file`` when given.  A 422 names the refused items: they are dropped and the rest is
sent once more, so one pod that just left does not cost the node's other windows.

A batch refused for a passing reason (a follower's 503 during a leader hand-over, 409
before the first plan, 429, another 5xx, or no answer at all) is held, not dropped, and
resent with the next report, oldest first and one POST per held batch (a batch names a
pod once), after the server's ``Retry-After`` (capped at
:data:`RETRY_AFTER_CAP_SECONDS`; until then a report is held without posting).  What
the server took, or refused as bad input (any other 4xx), is never resent.  The hold is
bounded: at most ``max_held`` windows (the oldest dropped first), and a window older
than ``max_age_seconds`` is dropped, since the extender refuses it as stale anyway
(``observation_max_age_seconds``, 120 s by default).  ``dropped`` counts both.
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

__all__ = ["MAX_HELD_WINDOWS", "RETRY_AFTER_CAP_SECONDS", "STALE_AFTER_SECONDS", "Reporter"]

log = logging.getLogger(__name__)

RETRY_AFTER_CAP_SECONDS = 30.0
"""Longest ``Retry-After`` honoured: a hand-over takes a Lease duration (15 s default)."""
STALE_AFTER_SECONDS = 110.0
"""A held window older than this is dropped: the extender's default staleness bound
(``observation_max_age_seconds`` = 120 s) less a margin for transit and clock skew."""
MAX_HELD_WINDOWS = 4096
"""Windows held for resending (two batches of a node's every pod, with a wide margin)."""
TRANSIENT = frozenset({409, 429})
"""4xx answers that say "not now" rather than "bad input"."""


class Reporter:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ca_file: str | None = None,
        client_cert: tuple[str, str] | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
        max_held: int = MAX_HELD_WINDOWS,
        max_age_seconds: float = STALE_AFTER_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context(cafile=ca_file)
        if client_cert is not None:
            context.load_cert_chain(*client_cert)
        self.client = httpx.Client(
            base_url=url.rstrip("/"),
            headers=headers,
            verify=context,
            timeout=timeout,
            transport=transport,
        )
        self.max_held = max_held
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self.retry_at = float("-inf")
        """No POST before this (the agent's clock): the server's capped ``Retry-After``."""
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
                    "/observations", json={"node": node, "observations": items}
                )
            except httpx.HTTPError as exc:
                log.warning("report.failed", extra={"error": str(exc), "held": len(items)})
                return {"error": str(exc)}, items
            if reply.status_code == 200:
                result: dict[str, Any] = reply.json()
                return result, None
            try:
                answer = reply.json()
            except ValueError:
                answer = {"Error": reply.text[:200]}
            failed = {"error": answer.get("Error"), "status": reply.status_code}
            if reply.status_code in TRANSIENT or reply.status_code >= 500:
                self._wait(reply.headers.get("Retry-After"))
                log.warning("report.held", extra={**failed, "windows": len(items)})
                return failed, items
            refused = set(answer.get("refused") or ())
            log.warning("report.refused", extra=failed)
            if reply.status_code != 422 or not refused or attempt:
                return failed, None
            items = [item for i, item in enumerate(items) if i not in refused]
            if not items:
                return failed, None
        return {"error": "unreachable"}, None

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
