"""Kept pair answers (issue 14, session 19): a placer that keeps S_hat per pair answers
exactly as one that asks the predictor every time, and forgets them when it learns."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import a100_nodes

from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor
from elastico_extender.core.planner import pair_cache
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.placement import Placer

NAMES = ["dcgan", "ncf", "pointnet"]


def _lean(fam: object) -> int:
    return int(np.argmin(fam.resources[:, 1]))  # type: ignore[attr-defined]


def _full_placer(families, predictor, nodes: int) -> Placer:
    """Every device holds one tolerant tenant of one of ``NAMES``: a newcomer must share."""
    placer = Placer(DeviceTable(a100_nodes(nodes, 4), 512.0), predictor, rows=64)
    for d in range(placer.table.size):
        fam = families[NAMES[d % len(NAMES)]]
        c = _lean(fam)
        placer.commit(30 + d, c, [d], fam.resources[c], fam.features[c], 9.0)
    return placer


def _observed(families, victim: str, partner: str, memory_gib: float) -> np.ndarray:
    """Feature rows of every (victim configuration, partner's lean one) pair, both ways."""
    a, b = families[victim], families[partner]
    mine = np.asarray(a.features, dtype=np.float32)
    theirs = np.repeat(np.asarray(b.features[_lean(b)], dtype=np.float32)[None], a.size, axis=0)
    return np.concatenate(
        [pair_features(mine, theirs, memory_gib), pair_features(theirs, mine, memory_gib)]
    )


def test_a_placer_kept_while_the_correction_learns_answers_what_it_learned(families):
    """The service's PlacementView keeps one placer while observations teach the online
    correction: a question asked again must get the new answer, not a kept one."""
    correction = OnlineCorrection(ContentionPredictor())
    placer = _full_placer(families, correction, 2)
    fam = families["dcgan"]
    k = fam.size
    options = [_lean(fam)]
    tolerance = np.full(k, 1.6)

    def ask(p: Placer) -> object:
        return p.try_place(
            99, 1, options, fam.resources, fam.features, tolerance, commit=False, shape="dcgan"
        )

    before = ask(placer)
    assert before is not None  # the heuristic lets it share
    memory = float(placer.table.memory_total[0]) / 1024.0
    for partner in NAMES:  # every tenant is observed to suffer a dcgan 3x, and back
        rows = _observed(families, "dcgan", partner, memory)
        for _ in range(20):
            correction.learn(rows, np.full(rows.shape[0], 3.0))
    fresh = _full_placer(families, correction, 2)
    fresh.pairs = None
    assert ask(fresh) is None  # what the correction now says
    assert ask(placer) is None  # and the placer kept since says the same


def _ask_both(placers, rng, families, row, apart_rows):
    """One random question to every placer: (row, family, answers committed, answers)."""
    name = NAMES[int(rng.integers(len(NAMES)))]
    fam = families[name]
    k = fam.size
    options = [int(c) for c in rng.permutation(k)[: int(rng.integers(1, k + 1))]]
    tolerance = np.round(rng.uniform(1.0, 1.8, size=k), 2)
    gpus = 2 if rng.random() < 0.15 else 1
    use_shape = rng.random() < 0.7
    shape = (name, gpus) if use_shape else None
    commit = True
    if apart_rows and rng.random() < 0.3:  # a constrained row, asked again and again
        row, commit = int(rng.choice(apart_rows)), False
    answers = [
        p.try_place(
            row,
            gpus,
            options,
            fam.resources,
            fam.features,
            tolerance,
            shape=shape,
            commit=commit,
        )
        for p in placers
    ]
    return row, fam, (answers if commit else [None, None]), answers


@pytest.mark.parametrize("tiny", [False, True])
def test_kept_answers_place_every_job_exactly_as_asking_the_predictor_does(
    families, monkeypatch, tiny
):
    """Two placers fed the same random queue (three shapes, gangs, held-apart rows,
    tolerances on a fine grid, commits and releases) while the correction learns now and
    then; one keeps pair answers, one asks every time: every answer agrees, to the bit.
    ``tiny`` bounds the cache to a few entries, so it forgets constantly."""
    if tiny:
        monkeypatch.setattr(pair_cache, "PAIR_ANSWERS", 8)
        monkeypatch.setattr(pair_cache, "JOB_BLOCKS", 4)
        monkeypatch.setattr(pair_cache, "MEMORY_SIZES", 1)
    rng = np.random.default_rng(19)
    for trial in range(2):
        correction = OnlineCorrection(ContentionPredictor())
        placers = [_full_placer(families, correction, 12) for _ in range(2)]
        placers[1].pairs = None
        for p in placers:
            p.set_loop({(150, 30), (30, 150), (151, 31), (31, 151)}, {152})
        memory = float(placers[0].table.memory_total[0]) / 1024.0
        placed: list[tuple[int, np.ndarray]] = []
        refused = kept = 0
        for step in range(250):
            row, fam, answers, asked = _ask_both(
                placers, rng, families, 200 + step, [150, 151, 152]
            )
            assert asked[0] == asked[1], (trial, step)
            refused += asked[0] is None
            if answers[0] is not None:
                placed.append((row, fam.resources[answers[0].config]))
            if placed and rng.random() < 0.2:
                gone, demand = placed.pop(int(rng.integers(len(placed))))
                for p in placers:
                    p.release(gone, demand)
            if rng.random() < 0.05:  # observations arrive: the correction learns a pair
                victim, partner = rng.choice(NAMES, size=2)
                rows = _observed(families, str(victim), str(partner), memory)
                correction.learn(rows, rng.uniform(1.0, 3.0, size=rows.shape[0]))
                kept += 1
            busy = np.flatnonzero(placers[0].table.count > 0)
            block = fam.features[int(rng.integers(fam.size))]
            got = [p.predict_against(busy, block, 1.3) for p in placers]
            assert np.array_equal(got[0][0], got[1][0]) and np.array_equal(got[0][1], got[1][1])
        assert placed and refused > 20 and kept > 3, (len(placed), refused, kept)
        if not tiny:
            assert placers[0].pairs is not None and placers[0].pairs._answers


def test_a_replaced_predictor_is_never_answered_from_the_old_ones_pairs(families):
    placer = _full_placer(families, ContentionPredictor(), 2)
    fam = families["dcgan"]
    busy = np.flatnonzero(placer.table.count > 0)
    block = fam.features[_lean(fam)]
    _, worst = placer.predict_against(busy, block, 1.5)

    class Harsh:
        name = "harsh"
        generation = 0

        def predict(self, features: np.ndarray) -> np.ndarray:
            return np.full(features.shape[0], 2.5)

    placer.predictor = Harsh()
    safe, harsh = placer.predict_against(busy, block, 1.5)
    assert not safe.any() and np.all(harsh == 2.5) and np.all(worst < 2.5)
