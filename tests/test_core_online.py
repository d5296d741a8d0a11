"""Closed loop, Learn: the online correction converges on seen pairs, leaves unseen at base."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from elastico_extender.core.closed_loop import KNOWN_WINDOWS, ClosedLoop, RunningConfig
from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import (
    ContentionPredictor,
    predictor_generation,
)
from elastico_extender.core.observations import Observation
from elastico_extender.service.predictor import GuardedPredictor


def rows(families, victim: str, vc: int, partner: str, pc: int) -> np.ndarray:
    return pair_features(families[victim].features[[vc]], families[partner].features[[pc]], 40.0)


def test_seen_pair_converges_to_observed_and_unseen_pairs_keep_the_base(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base)
    seen = rows(families, "bert", 0, "resnet50", 0)
    unseen_family = rows(families, "bert", 0, "dcgan", 0)
    before_unseen = base.predict(unseen_family)
    truth = 2.4
    rng = np.random.default_rng(0)
    for _ in range(40):
        correction.learn(seen, [truth * float(np.exp(rng.normal(0, 0.03)))])
    assert correction.predict(seen)[0] == pytest.approx(truth, rel=0.03)
    assert base.predict(seen)[0] < truth * 0.9  # the base model was wrong about it
    np.testing.assert_allclose(correction.predict(unseen_family), before_unseen)


def test_shrinkage_weighs_the_base_until_evidence_accumulates(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base, prior_samples=1.0)
    x = rows(families, "bert", 0, "resnet50", 0)
    b = float(base.predict(x)[0])
    correction.learn(x, [b * 2.0])
    one = float(correction.predict(x)[0])
    assert b < one < b * 2.0  # one sample moves it part of the way
    for _ in range(20):
        correction.learn(x, [b * 2.0])
    assert correction.predict(x)[0] == pytest.approx(b * 2.0, rel=0.01)


def test_other_configurations_of_a_seen_family_pair_move_with_it(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base)
    x = rows(families, "bert", 0, "resnet50", 0)
    other = rows(families, "bert", 1, "resnet50", 2)
    for _ in range(10):
        correction.learn(x, [float(base.predict(x)[0]) * 1.5])
    assert correction.predict(other)[0] > base.predict(other)[0] * 1.3


def test_observed_windows_count_the_configuration_pair_only(families):
    """What observation stands behind an answer: windows of that very configuration pair
    (a family pair's other configurations borrow its shift, not its observations)."""
    correction = OnlineCorrection(ContentionPredictor(), memory=5)
    x = rows(families, "bert", 0, "resnet50", 0)
    other = rows(families, "bert", 1, "resnet50", 2)
    reverse = rows(families, "resnet50", 0, "bert", 0)
    both = np.concatenate([x, other, reverse])
    np.testing.assert_array_equal(correction.observed_windows(both), [0, 0, 0])
    for k in range(1, 8):
        correction.learn(x, [1.5])
        assert correction.observed_windows(both).tolist() == [min(k, 5), 0, 0]


def test_bad_labels_teach_nothing(families):
    correction = OnlineCorrection(ContentionPredictor())
    x = rows(families, "bert", 0, "resnet50", 0)
    correction.learn(np.repeat(x, 3, axis=0), [np.nan, 0.5, np.inf])
    assert correction.samples_seen == 0 and correction.pairs == 0
    with pytest.raises(ValueError, match="observed"):
        correction.learn(x, [1.0, 2.0])


def test_closed_loop_labels_single_partner_windows_and_teaches_the_correction(families):
    loop = ClosedLoop(OnlineCorrection(ContentionPredictor()))
    running = {"a": RunningConfig("bert", 0), "b": RunningConfig("resnet50", 0)}
    for job in ("a", "b"):
        loop.book.set_reference(job, 0, "samples/s", 100.0)
    labelled = loop.record(
        [
            Observation("a", 0, 10.0, 5.0, 40.0, "samples/s", ("b",)),
            Observation("b", 0, 10.0, 5.0, 80.0, "samples/s", ("a",)),
        ],
        running,
        families,
    )
    np.testing.assert_allclose(labelled.observed, [2.5, 1.25])
    assert labelled.victims == ("a", "b")
    assert loop.correction is not None and loop.correction.pairs == 2
    assert loop.observed()["a"].slowdown == pytest.approx(2.5)


@pytest.mark.parametrize(
    ("partner_configs", "crowded", "labels"),
    [
        ((("resnet50", 0), ("resnet50", 0)), False, 1),  # one pair on every device
        ((("resnet50", 0), ("resnet50", 0)), True, 0),  # two partners on one device add up
        ((("resnet50", 0), ("resnet50", 1)), True, 0),  # crowded, two pairs: nothing to rank
    ],
)
def test_a_multi_gpu_window_labels_its_pair_when_every_device_holds_the_same_one(
    families, partner_configs, crowded, labels
):
    """A synchronous multi-GPU job runs at its slowest device's pace.  With one partner
    per device, all of one family and configuration, every device holds the same pair,
    so the window's slowdown is that pair's (before, any window with two or more
    partners taught nothing, so a multi-GPU job's own direction was never learned)."""
    loop = ClosedLoop(OnlineCorrection(ContentionPredictor()))
    running = {"a": RunningConfig("bert", 0, crowded=crowded)}
    for name, (family, config) in zip(("b", "c"), partner_configs, strict=True):
        running[name] = RunningConfig(family, config)
    loop.book.set_reference("a", 0, "samples/s", 100.0)
    window = Observation("a", 0, 10.0, 5.0, 50.0, "samples/s", ("b", "c"))
    labelled = loop.record([window], running, families)
    assert len(labelled.observed) == labels
    if labels:
        assert labelled.observed[0] == pytest.approx(2.0)
        assert labelled.victims == ("a",) and labelled.partners[0] in ("b", "c")


def _gang_next_to_two_kinds(families, known: dict[str, float]) -> tuple[ClosedLoop, dict]:
    """Job a (bert) with partner b (resnet50) on one GPU and c (dcgan) on the other
    (``loop_running``); ``known``: partner -> the slowdown a's pair with it was
    observed at, on windows of its own, before."""
    loop = ClosedLoop(OnlineCorrection(ContentionPredictor()))
    loop.book.set_reference("a", 0, "samples/s", 100.0)
    pairs = {
        "b": rows(families, "bert", 0, "resnet50", 0),
        "c": rows(families, "bert", 0, "dcgan", 0),
    }
    assert loop.correction is not None
    for partner, slowdown in known.items():
        for _ in range(KNOWN_WINDOWS):
            loop.correction.learn(pairs[partner], [slowdown])
    return loop, pairs


GANG_WINDOW = Observation("a", 0, 10.0, 5.0, 40.0, "samples/s", ("b", "c"))  # S = 2.5


def test_a_gang_window_next_to_two_kinds_labels_the_one_pair_that_can_explain_it(families):
    """One partner per GPU, of two kinds: the job ran at its slowest GPU's pace, so the
    window's slowdown (2.5) is its worst pair's.  Pair (a|b) is known at 1.2, far
    below: only (a|c) can be the 2.5, and it learns so.  Before, such windows taught
    nothing, and a gang's harmful pair was admitted again and separated again."""
    loop, pairs = _gang_next_to_two_kinds(families, {"b": 1.2})
    assert loop.correction is not None
    known_before = float(loop.correction.predict(pairs["b"])[0])
    labelled = loop.record([GANG_WINDOW], loop_running(), families)
    assert labelled.victims == ("a",) and labelled.partners == ("c",)
    assert labelled.observed[0] == pytest.approx(2.5)
    assert float(loop.correction.predict(pairs["b"])[0]) == pytest.approx(known_before)


@pytest.mark.parametrize(
    "known",
    [
        {},  # nothing known: either pair could be the slow one
        {"b": 2.7},  # the known pair alone may explain the window (within the margin)
        {"b": 1.2, "c": 1.3},  # nothing unknown to learn (and the two disagree with it)
    ],
)
def test_a_gang_window_no_single_pair_can_explain_teaches_nothing(families, known):
    loop, _ = _gang_next_to_two_kinds(families, known)
    assert loop.correction is not None
    taught = loop.correction.samples_seen
    labelled = loop.record([GANG_WINDOW], loop_running(), families)
    assert len(labelled.observed) == 0
    assert loop.correction.samples_seen == taught


def loop_running() -> dict[str, RunningConfig]:
    return {
        "a": RunningConfig("bert", 0),
        "b": RunningConfig("resnet50", 0),
        "c": RunningConfig("dcgan", 0),
    }


def test_mixed_windows_are_not_attributed_without_a_correction_or_with_an_unknown_partner(
    families,
):
    loop, _ = _gang_next_to_two_kinds(families, {"b": 1.2})
    window = Observation("a", 0, 10.0, 5.0, 40.0, "samples/s", ("b", "gone"))
    assert len(loop.record([window], loop_running(), families).observed) == 0
    blind = ClosedLoop()
    blind.book.set_reference("a", 0, "samples/s", 100.0)
    assert blind.label([blind.book.record(GANG_WINDOW, "bert")], loop_running(), families) == []


def test_a_new_configuration_of_a_seen_family_pair_follows_its_nearest_observed_one(families):
    """Configurations of one family pair can differ widely (a batch size doubles the
    harm): a configuration pair never observed answers with the observed one beside it
    rather than with the family pair's mean alone."""
    base = ContentionPredictor()
    correction = OnlineCorrection(base)
    harmed = rows(families, "bert", 0, "resnet50", 0)
    spared = rows(families, "bert", 2, "resnet50", 2)
    for _ in range(20):
        correction.learn(harmed, base.predict(harmed) * 2.0)
        correction.learn(spared, base.predict(spared))
    beside = harmed.copy()
    beside[:, 8] += 0.01  # another micro-batch, same families: a new configuration pair
    ratio = float(correction.predict(beside)[0] / base.predict(beside)[0])
    assert ratio > 1.8  # the family pair's mean alone reads about 1.41 (sqrt 2)
    far = harmed.copy()
    far[:, 8] += 30.0  # same family pair, far from both: the family pair's mean
    mean = float(correction.predict(far)[0] / base.predict(far)[0])
    assert 1.3 < mean < 1.5


def nudged(x: np.ndarray, step: float) -> np.ndarray:
    """``x`` with both jobs' log10_params moved by ``step``: a new family pair (new keys)."""
    y = x.copy()
    y[:, [6, 20]] += step
    return y


def test_unseen_family_pair_near_observed_pairs_borrows_their_correction(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base)
    seen = rows(families, "bert", 0, "resnet50", 0)
    for _ in range(20):
        correction.learn(seen, [float(base.predict(seen)[0]) * 1.6])
    near = nudged(seen, 0.02)
    b = float(base.predict(near)[0])
    borrowed = float(correction.predict(near)[0])
    assert b * 1.35 < borrowed < b * 1.6  # moved most of the way, shrunk by its distance
    nearer = float(correction.predict(nudged(seen, 0.005))[0]) / float(
        base.predict(nudged(seen, 0.005))[0]
    )
    assert nearer > borrowed / b  # the closer the row, the more it borrows


def test_unseen_family_pair_far_from_every_observed_pair_keeps_the_base(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base)
    learned = np.concatenate(
        [
            rows(families, "bert", 0, "resnet50", 0),
            rows(families, "bert", 1, "resnet50", 1),
            rows(families, "resnet50", 2, "bert", 0),
        ]
    )
    for _ in range(10):
        correction.learn(learned, base.predict(learned) * 2.0)
    far = np.concatenate([nudged(learned[:1], 3.0), rows(families, "dcgan", 0, "lstm", 0)])
    np.testing.assert_array_equal(correction.predict(far), base.predict(far))


def test_neighbour_ring_is_bounded_and_keeps_the_newest_pairs(families):
    base = ContentionPredictor()
    correction = OnlineCorrection(base, neighbours=4)
    names = sorted(families)
    xs = [rows(families, names[i], 0, names[(i + 1) % len(names)], 0) for i in range(10)]
    for x in xs:
        correction.learn(x, base.predict(x) * 1.5)
    kept = correction.neighbour_rows()
    assert len(kept) == 4
    np.testing.assert_array_equal(np.stack([row for _, row, _, _ in kept]), np.concatenate(xs[-4:]))


def test_generations_move_when_answers_can_change_and_stay_put_otherwise():
    base = ContentionPredictor()
    assert predictor_generation(base) == 0
    correction = OnlineCorrection(base)
    lock = threading.Lock()
    guarded = GuardedPredictor(correction, lock)
    start = correction.generation
    assert start is not None and guarded.generation == start
    x = np.random.default_rng(0).uniform(0.1, 0.9, size=(4, 36)).astype(np.float32)
    correction.predict(x)
    assert correction.generation == start  # answering changes nothing
    correction.learn(x, np.full(4, 500.0))  # out of range labels teach nothing
    assert correction.generation == start
    correction.learn(x, np.full(4, 2.0))
    learned = correction.generation
    assert learned is not None and learned > start and guarded.generation == learned
    correction.restore_rows("config", correction.rows("config"))
    assert correction.generation is not None and correction.generation > learned
    restored = correction.generation
    correction.restore_neighbours(correction.neighbour_rows())
    assert correction.generation is not None and correction.generation > restored

    class Unknown:
        name = "unknown"

        def predict(self, features: np.ndarray) -> np.ndarray:
            return np.ones(features.shape[0])

    assert OnlineCorrection(Unknown()).generation is None  # may change: never kept
