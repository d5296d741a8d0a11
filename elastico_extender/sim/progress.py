"""A small progress bar on stderr (no dependency): one line, redrawn in place."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``bar.update(state)`` with ``state = {policy: (jobs done, jobs total)}``."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.width = width
        self.start = time.monotonic()
        self._last = 0.0
        self.enabled = True

    def update(self, state: dict[str, tuple[int, int]], force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._last < 0.2):
            return
        self._last = now
        done = sum(d for d, _ in state.values())
        total = max(sum(t for _, t in state.values()), 1)
        frac = done / total
        filled = round(frac * self.width)
        finished = sum(1 for d, t in state.values() if d >= t)
        line = (
            f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {100 * frac:5.1f}% "
            f"policies {finished}/{len(state)}  {now - self.start:6.1f}s"
        )
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
