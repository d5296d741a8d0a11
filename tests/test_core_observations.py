"""The observation book: progress rates become observed slowdowns against a solo reference."""

from __future__ import annotations

import math

import pytest

from elastico_extender.core.observations import Observation, ObservationBook


def window(rate: float, end: float, partners: tuple[str, ...] = (), config: int = 0) -> Observation:
    return Observation("a", config, end, 5.0, rate, "launches/s", partners)


def test_shared_rate_below_solo_rate_is_a_slowdown():
    book = ObservationBook(smoothing=1.0)
    assert book.record(window(100.0, 5.0)) == []
    samples = book.record(window(50.0, 10.0, ("b",)))
    assert [s.partner for s in samples] == ["b"]
    assert samples[0].slowdown == pytest.approx(2.0)
    assert book.observed()["a"].slowdown == pytest.approx(2.0)


def test_no_reference_means_no_slowdown():
    book = ObservationBook()
    assert book.record(window(50.0, 5.0, ("b",))) == []
    assert "a" not in book.observed()


def test_a_new_configuration_starts_a_new_history():
    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    book.record(window(40.0, 10.0, ("b",)))
    book.record(window(80.0, 15.0, config=1))
    assert book.observed()["a"].samples == 1
    # Window slowdowns stay comparable across a switch: harm survives a step-down.
    assert book.observed()["a"].recent == pytest.approx((1.0, 2.5, 1.0))


@pytest.mark.parametrize(
    ("field", "value"), [("rate", math.nan), ("rate", -1.0), ("seconds", 0.0), ("end", math.inf)]
)
def test_unusable_reports_are_refused_naming_the_field(field, value):
    book = ObservationBook()
    kwargs = {"job_id": "a", "config": 0, "end": 1.0, "seconds": 5.0, "rate": 1.0, field: value}
    with pytest.raises(ValueError, match=field):
        book.record(Observation(**kwargs))
    assert book.observed() == {}


def test_book_is_bounded_and_references_survive_a_restore():
    book = ObservationBook(max_jobs=2, max_refs=2)
    for i in range(5):
        book.record(Observation(f"j{i}", 0, 1.0, 5.0, 10.0))
    assert len(book.observed()) == 2
    again = ObservationBook()
    again.restore(book.state())
    assert again.reference("j4", 0, "launches/s") == pytest.approx(10.0)
