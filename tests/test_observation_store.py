"""The observation store on a real SQLite file: references round-trip through the core's
book, pair samples are kept newest-first up to the bound, and a second connection (a
restarted extender) reads what the first wrote."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastico_extender.core.observations import Observation, ObservationBook
from elastico_extender.profiles.observations import ObservationStore, StoredSample


def test_references_written_as_they_change_restore_a_book(tmp_path: Path) -> None:
    path = tmp_path / "loop.db"
    store = ObservationStore(path)
    book = ObservationBook(smoothing=1.0)
    book.record(Observation("a", 3, 10.0, 5.0, 400.0))
    book.record(Observation("a", 3, 15.0, 5.0, 500.0, "launches/s"))
    store.put_references([("a", 3, "launches/s", book.reference("a", 3, "launches/s") or 0)], 15.0)
    store.put_references([("b", 0, "tokens/s", 90.0)], 16.0)
    store.close()
    again = ObservationBook()
    again.restore(ObservationStore(path).book_state())
    assert again.reference("a", 3, "launches/s") == pytest.approx(500.0)
    assert again.reference("b", 0, "tokens/s") == pytest.approx(90.0)
    assert again.reference("a", 0, "launches/s") is None


def test_pair_samples_are_bounded_to_the_newest(tmp_path: Path) -> None:
    store = ObservationStore(tmp_path / "loop.db", max_samples=5)
    for i in range(12):
        store.add_samples([StoredSample("a", 1, "b", 1.0 + i / 10, 1.2 if i % 2 else None, i)])
    kept = store.samples()
    assert [s.end for s in kept] == [7, 8, 9, 10, 11]
    assert kept[0] == StoredSample("a", 1, "b", pytest.approx(1.7), 1.2, 7)
    assert kept[1].predicted is None


def test_an_unopenable_store_is_a_clear_error(tmp_path: Path) -> None:
    from elastico_extender.errors import ProfileStoreError

    with pytest.raises(ProfileStoreError, match="cannot open observation store"):
        ObservationStore(tmp_path / "missing-dir" / "loop.db")
