"""The serve process's garbage-collector policy: freeze after each epoch, collect now and then."""

from __future__ import annotations

import gc

import pytest

from elastico_extender.service.gc_policy import FreezeAfterEpochs


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def restore_gc():
    gc.disable()  # no automatic collection may run in between: the counts are exact
    yield
    gc.enable()
    gc.unfreeze()


def test_objects_alive_after_an_epoch_leave_the_scanned_generations(restore_gc):
    policy = FreezeAfterEpochs(full_every=3)
    before = gc.get_freeze_count()
    kept = [Cycle() for _ in range(100)]
    policy()
    assert gc.get_freeze_count() >= before + 100
    assert all(not any(o is c for o in gc.get_objects()) for c in kept[:3])  # not scanned


def test_every_full_every_epochs_frozen_cycles_are_collected(restore_gc):
    policy = FreezeAfterEpochs(full_every=2)
    for _ in range(50):
        Cycle()  # unreachable cycles: only the cyclic collector frees them
    policy()  # epoch 1: frozen with the garbage
    assert policy.collected == 0
    policy()  # epoch 2: unfreeze, collect, freeze
    assert policy.collected >= 50


def test_full_every_must_be_positive():
    with pytest.raises(ValueError, match="full_every"):
        FreezeAfterEpochs(full_every=0)
