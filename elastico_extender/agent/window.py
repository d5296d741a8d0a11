"""Cumulative counters -> rates over a window (framework counters; pure, no clock)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["CounterRates"]


class CounterRates:
    """Per source, the rate between its last two readings (value, time).

    A counter that goes backwards was reset (the process restarted): that reading becomes
    the new baseline and gives no rate.  At most ``max_sources`` sources are remembered.
    """

    def __init__(self, max_sources: int = 4096) -> None:
        self.max_sources = max_sources
        self._last: OrderedDict[Hashable, tuple[float, float]] = OrderedDict()

    def update(self, source: Hashable, value: float, at: float) -> tuple[float, float] | None:
        """``(rate, seconds)`` since the previous reading of ``source``, or None."""
        previous = self._last.get(source)
        self._last[source] = (value, at)
        self._last.move_to_end(source)
        while len(self._last) > self.max_sources:
            self._last.popitem(last=False)
        if previous is None or value < previous[0] or at <= previous[1]:
            return None
        seconds = at - previous[1]
        return (value - previous[0]) / seconds, seconds

    def last(self, source: Hashable) -> tuple[float, float] | None:
        """The source's newest reading ``(value, time)``, if any."""
        return self._last.get(source)

    def forget(self, source: Hashable) -> None:
        self._last.pop(source, None)
