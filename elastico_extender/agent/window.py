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
        reset = self.went_back(source, value)
        previous = self._last.get(source)
        self._last[source] = (value, at)
        self._last.move_to_end(source)
        while len(self._last) > self.max_sources:
            self._last.popitem(last=False)
        if previous is None or reset or at <= previous[1]:
            return None
        seconds = at - previous[1]
        return (value - previous[0]) / seconds, seconds

    def went_back(self, source: Hashable, value: float) -> bool:
        """Whether ``value`` is below the source's newest reading: the counter was reset
        (the process restarted), and :meth:`update` would take it as a new baseline."""
        previous = self._last.get(source)
        return previous is not None and value < previous[0]

    def forget(self, source: Hashable) -> None:
        self._last.pop(source, None)
