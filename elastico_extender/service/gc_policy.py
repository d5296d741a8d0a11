"""Keep the cyclic garbage collector's pauses out of the verbs' latency.

Each epoch publishes a new snapshot, plan and placement view: tens of thousands
of container objects that live for one epoch.  Left to CPython's generational
collector, they are scanned again and again, and every so often a full
collection walks all of them while a filter waits (12 ms measured in-process at
1,000 nodes).  After each epoch everything alive is moved to the permanent
generation instead (``gc.freeze``, a constant-time list splice), so routine
collections only scan what requests allocate.  The epoch's structures are
acyclic, so reference counting frees them when the next epoch replaces them;
in case a cycle does slip in, every ``full_every`` epochs the permanent
generation is released and collected once.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["FreezeAfterEpochs"]

log = logging.getLogger(__name__)


class FreezeAfterEpochs:
    """An ``Engine.after_epoch`` hook: freeze after every epoch, full collection
    (unfreeze, collect, freeze) after every ``full_every`` epochs."""

    def __init__(self, full_every: int = 120) -> None:
        if full_every < 1:
            raise ValueError("full_every must be >= 1")
        self.full_every = full_every
        self.epochs = 0
        self.collected = 0  # cyclic garbage found by the full collections so far

    def __call__(self) -> None:
        self.epochs += 1
        if self.epochs % self.full_every == 0:
            gc.unfreeze()
            found = gc.collect()
            self.collected += found
            if found:
                log.info("gc.cycles", extra={"collected": found, "epochs": self.epochs})
        gc.freeze()
