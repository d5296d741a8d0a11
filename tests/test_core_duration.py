"""The shared job-length estimator: learns from completed jobs only, shrinks sparse keys."""

from __future__ import annotations

import math

import pytest

from elastico_extender.core.duration import CompletedJob, DurationBook, DurationEstimator
from elastico_extender.core.model import Job


def test_prior_before_any_completion() -> None:
    est = DurationEstimator(prior_s=1800.0)
    assert est.predict(Job("a", "resnet50")) == pytest.approx(1800.0)


def test_learns_family_length_from_completions() -> None:
    recs = [CompletedJob("resnet50", 1, 36000.0)] * 40 + [CompletedJob("ncf", 1, 600.0)] * 40
    est = DurationEstimator().fit(recs)
    long, short = est.predict(Job("a", "resnet50")), est.predict(Job("b", "ncf"))
    assert long > 10 * short
    assert long == pytest.approx(36000.0, rel=0.2)


def test_gpu_count_and_user_refine_the_estimate() -> None:
    recs = [CompletedJob("bert", 8, 50000.0, "alice")] * 30
    recs += [CompletedJob("bert", 1, 2000.0, "bob")] * 30
    est = DurationEstimator().fit(recs)
    assert est.predict(Job("x", "bert", gpus=8, user="alice")) > 5 * est.predict(
        Job("y", "bert", gpus=1, user="bob")
    )


def test_one_sample_moves_the_estimate_only_partly() -> None:
    est = DurationEstimator(prior_s=3600.0, shrink=3.0).fit([CompletedJob("ppo", 2, 360000.0)])
    got = est.predict(Job("a", "ppo", gpus=2))
    assert 3600.0 < got < 360000.0


def test_unseen_family_falls_back_to_gpu_level() -> None:
    recs = [CompletedJob("resnet50", 4, 20000.0)] * 50
    est = DurationEstimator(prior_s=100.0).fit(recs)
    assert est.predict(Job("a", "lstm", gpus=4)) > 5000.0


def test_fit_replaces_and_ignores_bad_records() -> None:
    est = DurationEstimator(prior_s=1000.0)
    est.fit([CompletedJob("ncf", 1, 9000.0)] * 20)
    est.fit([CompletedJob("ncf", 1, float("nan")), CompletedJob("ncf", 1, -5.0)])
    assert est.count == 0
    assert est.predict(Job("a", "ncf")) == pytest.approx(1000.0)


def test_bounded_keys() -> None:
    recs = [CompletedJob(f"fam{i}", 1, 100.0 + i, f"u{i}") for i in range(500)]
    est = DurationEstimator(max_keys=100).fit(recs)
    assert len(est._sums) <= 100
    assert math.isfinite(est.predict(Job("z", "fam3", user="u3")))


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan")])
def test_rejects_bad_prior(bad: float) -> None:
    with pytest.raises(ValueError, match="prior_s"):
        DurationEstimator(prior_s=bad)


# -- DurationBook: what a driver knows of job lengths ----------------------------------


def test_book_guesses_nothing_before_enough_completions() -> None:
    book = DurationBook(min_history=3)
    book.record(CompletedJob("ncf", 1, 600.0))
    book.record(CompletedJob("ncf", 1, 660.0))
    assert book.expected("ncf", 1) == 0.0
    book.record(CompletedJob("ncf", 1, 630.0))
    assert book.expected("ncf", 1) == pytest.approx(630.0, rel=0.6)


def test_book_starts_from_history_and_learns_per_user() -> None:
    history = [CompletedJob("bert", 4, 40_000.0, "alice")] * 20
    history += [CompletedJob("bert", 4, 1_000.0, "bob")] * 20
    book = DurationBook(history)
    assert book.expected("bert", 4, "alice") > 10 * book.expected("bert", 4, "bob")


def test_book_refits_when_over_a_quarter_more_jobs_finished() -> None:
    book = DurationBook([CompletedJob("ncf", 1, 600.0)] * 20)
    first = book.expected("ncf", 1)
    generation = book.generation
    for _ in range(5):  # 20 -> 25: not more than a quarter more, the old fit stands
        book.record(CompletedJob("ncf", 1, 60_000.0))
    assert book.expected("ncf", 1) == first and book.generation == generation
    book.record(CompletedJob("ncf", 1, 60_000.0))  # 26 > 1.25 x 20
    assert book.expected("ncf", 1) > 2 * first and book.generation == generation + 1


def test_book_is_bounded_and_ignores_bad_durations() -> None:
    book = DurationBook(capacity=10)
    for k in range(25):
        book.record(CompletedJob("ncf", 1, 100.0 + k))
    book.record(CompletedJob("ncf", 1, float("nan")))
    book.record(CompletedJob("ncf", 1, -1.0))
    assert len(book) == 10
    assert [c.duration_s for c in book.completed] == [115.0 + k for k in range(10)]
    with pytest.raises(ValueError, match="capacity"):
        DurationBook(capacity=0)


def test_a_tag_is_kept_with_its_completion_and_forgotten_with_it() -> None:
    """The service checkpoints the book's completions by pod uid: the tags must be the
    book's own, evicted with the completions they name, and a refused one never kept."""
    book: DurationBook[str] = DurationBook(capacity=3)
    for k in range(5):
        book.record(CompletedJob("ncf", 1, 100.0 + k), f"uid-{k}")
    assert not book.record(CompletedJob("ncf", 1, 0.0), "uid-bad")
    assert [(c.duration_s, tag) for c, tag in book.tagged()] == [
        (102.0, "uid-2"),
        (103.0, "uid-3"),
        (104.0, "uid-4"),
    ]
