"""The shared bearer token of the extender and its node agents, re-read when rotated.

Both sides read the token from a file (``--token-file``), in Kubernetes a Secret volume.
When the Secret changes, the kubelet swaps the volume's files atomically, node by node,
within about a minute; a token read once at start would then lock every agent out
until someone restarted the extender and every agent.  So the file is looked at again
(at most once a second, a ``stat``), and a changed file is read afresh.  For
``ROTATION_GRACE_S`` after a change the extender still accepts the previous token: the
agents on nodes whose kubelet has not yet synced the Secret keep reporting.

A file that becomes unreadable or empty keeps the last good token (one warning): a
half-written or deleted file must not lock everyone out.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from elastico_extender.userfiles import read_text, reason

__all__ = ["ROTATION_GRACE_S", "BearerToken"]

log = logging.getLogger(__name__)

ROTATION_GRACE_S = 300.0
"""How long the previous token stays accepted after a rotation (the kubelet's Secret sync
period is about a minute; five leave room for a slow node)."""
CHECK_EVERY_S = 1.0
"""At most one ``stat`` of the file per this many seconds."""
MAX_TOKEN_FILE_BYTES = 64 << 10
"""Largest token file read (a Secret's token is tens to hundreds of bytes)."""


def read_token(path: Path) -> str:
    """The token in ``path``; ValueError naming the file when it cannot be one."""
    try:
        token = read_text(path, MAX_TOKEN_FILE_BYTES).strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {reason(exc)}") from exc
    if not token:
        raise ValueError(f"{path} is empty")
    if any(c.isspace() or not c.isprintable() for c in token):
        raise ValueError(
            f"{path}: a bearer token is one word on one line: no spaces, line breaks or "
            "control characters inside (an Authorization header cannot carry them)"
        )
    return token


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when the file does (a Secret volume swaps in a new inode)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns, st.st_size


class BearerToken:
    """A token fixed at start (``BearerToken("...")``) or read from a file that may be
    rotated (``BearerToken.from_file(path)``, which raises ValueError if it is unusable
    at start)."""

    def __init__(
        self,
        token: str,
        path: Path | None = None,
        *,
        grace_s: float = ROTATION_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.grace_s = grace_s
        self.clock = clock
        self._token = token
        self._previous: str | None = None
        self._previous_until = float("-inf")
        self._stamp = _stamp(path) if path is not None else None
        self._checked = clock()
        self._warned = False
        self._lock = threading.Lock()

    @classmethod
    def from_file(
        cls,
        path: str | Path,
        *,
        grace_s: float = ROTATION_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> BearerToken:
        path = Path(path)
        return cls(read_token(path), path, grace_s=grace_s, clock=clock)

    def current(self) -> str:
        """The newest good token (what an agent sends)."""
        self._refresh()
        return self._token

    def accepts(self, given: bytes) -> bool:
        """Whether ``given`` is the token, or the previous one within the grace period
        (constant-time comparisons)."""
        self._refresh()
        with self._lock:
            token, previous = self._token, self._previous
            in_grace = previous is not None and self.clock() < self._previous_until
        ok = hmac.compare_digest(given, token.encode("utf-8"))
        if in_grace and previous is not None:
            ok = hmac.compare_digest(given, previous.encode("utf-8")) or ok
        return ok

    def _refresh(self) -> None:
        if self.path is None:
            return
        now = self.clock()
        with self._lock:
            if now - self._checked < CHECK_EVERY_S:
                return
            self._checked = now
            stamp = _stamp(self.path)
            if stamp == self._stamp:
                return
            try:
                token = read_token(self.path)
            except ValueError as exc:
                if not self._warned:  # once per bad spell, not once a second
                    log.warning("token.unusable_kept_last", extra={"error": str(exc)})
                    self._warned = True
                return
            self._stamp, self._warned = stamp, False
            if token != self._token:
                self._previous, self._previous_until = self._token, now + self.grace_s
                self._token = token
                log.info("token.rotated", extra={"path": str(self.path)})
