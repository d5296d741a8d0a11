"""Batched IAC screening answers exactly what per-configuration screening answers."""

from __future__ import annotations

import numpy as np
from conftest import a100_nodes

from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.planner.screening import OptionScreen


def _crowded_placer(families) -> tuple[Placer, list[str]]:
    table = DeviceTable(a100_nodes(2, 4), 512.0)
    placer = Placer(table, ContentionPredictor(), rows=16)
    names = sorted(families)
    rng = np.random.default_rng(3)
    for row in range(10):
        fam = families[names[row % len(names)]]
        config = int(np.argmin(fam.resources[:, 1]))  # leanest memory: many fit per GPU
        device = row % table.size
        placer.commit(
            row, config, [device], fam.resources[config], fam.features[config],
            float(rng.uniform(1.1, 1.6)),
        )  # fmt: skip
    return placer, names


def test_option_screen_matches_predict_against_for_every_configuration(families):
    placer, names = _crowded_placer(families)
    fam = families[names[0]]
    busy = np.flatnonzero(placer.table.count > 0)
    configs = list(range(fam.size))
    screen = OptionScreen(placer, busy, configs, fam.features)
    for config in configs:
        for tau in (1.05, 1.3, 2.0):
            want = placer.predict_against(busy, fam.features[config], tau)
            got = screen.verdict(config, busy, tau)
            assert np.array_equal(got[0], want[0])
            assert np.allclose(got[1], want[1])
    # A subset of the devices (best-fit top-k) is answered for that subset only.
    some = busy[::2]
    want = placer.predict_against(some, fam.features[0], 1.2)
    got = screen.verdict(0, some, 1.2)
    assert np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1])


def test_a_refused_first_choice_screens_the_rest_in_one_predictor_call(families):
    placer, names = _crowded_placer(families)
    calls: list[int] = []

    class Counting:
        name = "counting"

        def predict(self, x: np.ndarray) -> np.ndarray:
            calls.append(x.shape[0])
            return np.full(x.shape[0], 3.0)  # every pair refused

    placer.predictor = Counting()
    fam = families[names[1]]
    k = fam.size
    options = list(range(k))
    for d in range(placer.table.size):  # no idle GPU left
        if placer.table.count[d] == 0:
            placer.commit(20 + d, 0, [d], fam.resources[0] * 0, fam.features[0], 9.0)
    placed = placer.try_place(12, 1, options, fam.resources, fam.features, np.full(k, 1.5))
    assert placed is None
    # First choice alone, then every other one at once; one more call predicts, once per
    # device state, what the occupants of the two devices with two tenants already suffer.
    shared = sum(1 for m in placer.table.occupants.values() if len(m) >= 2)
    assert k > 2 and shared == 2 and len(calls) == 3
    assert sorted(calls).count(2 * shared) == 1  # 2 devices x 2 ordered pairs


def test_a_held_apart_row_is_refused_without_screening_once_its_question_failed(families):
    """Held-apart and run-alone rows only lose devices to their constraints: when the same
    question without them found nothing, they are refused at once, whatever their number."""
    placer, names = _crowded_placer(families)
    calls: list[int] = []

    class Refusing:
        name = "refusing"

        def predict(self, x: np.ndarray) -> np.ndarray:
            calls.append(x.shape[0])
            return np.full(x.shape[0], 3.0)

    placer.predictor = Refusing()
    fam = families[names[1]]
    k = fam.size
    for d in range(placer.table.size):  # no idle GPU left
        if placer.table.count[d] == 0:
            placer.commit(20 + d, 0, [d], fam.resources[0] * 0, fam.features[0], 9.0)
    placer.set_loop({(12, 0), (0, 12), (13, 1), (1, 13)}, set())
    question = ("family", 1, 0.0, *range(k))
    tau = np.full(k, 1.5)

    def ask(row: int) -> object:
        options = list(range(k))
        shapes, features = fam.resources, fam.features
        return placer.try_place(row, 1, options, shapes, features, tau, question=question)

    assert ask(12) is None
    asked = len(calls)
    assert asked > 0
    assert ask(13) is None
    assert len(calls) == asked  # the second held-apart row asked the predictor nothing
