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


def test_a_window_without_progress_is_a_pause_not_a_slowdown():
    """A restarted workload loading its model, a checkpoint, an inference server with no
    requests: a window of no progress at all.  It once read as a hundredfold slowdown
    (one such window is harm enough for the planner to separate the pair); it changes
    nothing, and the next window with progress is measured as usual."""
    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    book.record(window(80.0, 10.0, ("b",)))
    before = book.observed()["a"]
    assert book.record(window(0.0, 15.0, ("b",))) == []
    assert book.observed()["a"] == before
    assert book.record(window(0.0, 20.0)) == []
    assert book.reference("a", 0, "launches/s") == pytest.approx(100.0)
    (sample,) = book.record(window(50.0, 25.0, ("b",)))
    assert sample.slowdown == pytest.approx(2.0)
    assert book.observed()["a"].recent == pytest.approx((1.25, 2.0))


def test_a_mixed_window_counts_as_a_slowdown_and_teaches_nothing():
    """A partner came, went or restarted part-way through the window: its slowdown goes
    on in the harm case (it understates the partner's harm), but it labels no pair and,
    labelled alone (the partner left), moves no solo reference."""
    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    mixed = Observation("a", 0, 10.0, 5.0, 50.0, "launches/s", ("b",), mixed=True)
    assert book.record(mixed) == []
    assert book.observed()["a"].recent == pytest.approx((2.0,))
    (sample,) = book.record(window(40.0, 15.0, ("b",)))
    assert sample.slowdown == pytest.approx(2.5)
    assert book.observed()["a"].recent == pytest.approx((2.0, 2.5))  # one case
    book.record(Observation("a", 0, 20.0, 5.0, 80.0, "launches/s", (), mixed=True))
    assert book.reference("a", 0, "launches/s") == pytest.approx(100.0)


def test_no_reference_means_no_slowdown():
    book = ObservationBook()
    assert book.record(window(50.0, 5.0, ("b",))) == []
    assert "a" not in book.observed()


def test_a_new_configuration_starts_a_new_history():
    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    book.set_reference("a", 1, "launches/s", 80.0)
    book.record(window(40.0, 10.0, ("b",)))
    book.record(window(50.0, 15.0, ("b",), config=1))
    assert book.observed()["a"].samples == 1
    # Window slowdowns stay comparable across a switch: harm survives a step-down.
    assert book.observed()["a"].recent == pytest.approx((2.5, 1.6))


def test_other_partners_start_a_new_case():
    """Windows next to b say nothing about c: after a move only windows with the new
    partners count, so harm caused by b is not held against the pair with c."""
    from elastico_extender.core.planner.protect import (
        HARM_WINDOWS,
        ONE_WINDOW_MARGIN,
        harm_evidence,
    )

    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    for k in range(4):
        book.record(window(40.0, 10.0 + 5 * k, ("b",)))
    assert harm_evidence(book.observed()["a"], 25.0) == pytest.approx(2.5)
    book.record(window(95.0, 30.0, ("c",)))
    seen = book.observed()["a"]
    assert seen.recent == pytest.approx((100.0 / 95.0,))
    # fewer than HARM_WINDOWS with c: only the one-window rule speaks
    assert harm_evidence(seen, 30.0) == pytest.approx(100.0 / 95.0 / (1 + ONE_WINDOW_MARGIN))
    for k in range(1, HARM_WINDOWS):
        book.record(window(95.0, 30.0 + 5 * k, ("c",)))
    assert harm_evidence(book.observed()["a"], 40.0) == pytest.approx(100.0 / 95.0)
    book.record(window(95.0, 45.0, ("b", "c")))  # b joins: a new case again
    assert book.observed()["a"].recent == pytest.approx((100.0 / 95.0,))


def test_one_slow_solo_window_moves_the_reference_by_its_share_of_the_mean():
    """A job's solo rate at a fixed configuration is constant: its reference is the mean
    of its solo windows (past about ten, a moving average weighing the newest a fifth),
    so one window 7% slow (noise) leaves it 1.4% low, where the newest window weighing a
    half set it 3.5% low, and every shared window read that much low."""
    book = ObservationBook()
    for k in range(9):
        book.record(window(100.0, 5.0 * (k + 1)))
    book.record(window(93.0, 50.0))
    assert book.reference("a", 0, "launches/s") == pytest.approx(98.6)
    book.record(window(100.0 / 1.5, 55.0, ("b",)))
    assert book.observed()["a"].recent[-1] == pytest.approx(1.5 * 0.986)
    fresh = ObservationBook()
    for k, rate in enumerate((96.0, 100.0, 104.0)):
        fresh.record(window(rate, 5.0 * (k + 1)))
    assert fresh.reference("a", 0, "launches/s") == pytest.approx(100.0)  # a plain mean


def test_a_few_windows_alone_do_not_end_a_case():
    """A partner that pauses to restart at another configuration leaves the job alone
    for a window; when it is back the case goes on, so k windows above tau still count
    (restarting it let a harmful pair share a third epoch)."""
    from elastico_extender.core.planner.protect import harm_evidence

    book = ObservationBook(smoothing=1.0)
    book.record(window(100.0, 5.0))
    book.record(window(62.5, 10.0, ("b",)))  # 1.6
    book.record(window(100.0, 15.0))  # b restarts: a alone
    seen = book.observed()["a"]
    assert seen.partners == () and harm_evidence(seen, 15.0) is None
    book.record(window(62.5, 20.0, ("b",)))  # b is back
    seen = book.observed()["a"]
    assert seen.recent == pytest.approx((1.6, 1.6))
    assert harm_evidence(seen, 20.0) == pytest.approx(1.6)
    # another partner after the gap is another case
    book.record(window(100.0, 25.0))
    book.record(window(62.5, 30.0, ("c",)))
    assert book.observed()["a"].recent == pytest.approx((1.6,))
    # more than ``history`` windows alone end it
    for k in range(book.history + 1):
        book.record(window(100.0, 35.0 + 5 * k))
    book.record(window(62.5, 70.0, ("c",)))
    assert book.observed()["a"].recent == pytest.approx((1.6,))


def test_the_evidence_is_the_windows_own_and_staleness_is_the_planners():
    """The harm evidence is computed once per window, with the window (the planner
    reads it every epoch for every sharing job): it must follow the windows and the
    reference, whoever builds the record, while staleness stays a question of now."""
    import dataclasses

    from elastico_extender.core.observations import (
        FAMILY_MARGIN,
        ONE_WINDOW_MARGIN,
        ObservedSlowdown,
    )
    from elastico_extender.core.planner.protect import STALE_S, harm_evidence

    seen = ObservedSlowdown(1.4, 4, 100.0, (1.3, 1.5, 1.4, 1.6), ("p",), "family")
    # least of the newest two (1.4) < mean of four (1.45), raised by the family margin
    assert seen.evidence == pytest.approx(1.45 * (1 + FAMILY_MARGIN))
    solo = dataclasses.replace(seen, reference="solo", recent=(1.0, 2.0))
    assert solo.evidence == pytest.approx(2.0 / (1 + ONE_WINDOW_MARGIN))  # one window alone
    assert harm_evidence(seen, 100.0 + STALE_S) == pytest.approx(seen.evidence)
    assert harm_evidence(seen, 100.0 + STALE_S + 1.0) is None  # stale: no case
    assert harm_evidence(dataclasses.replace(seen, partners=()), 100.0) is None  # alone
    assert ObservedSlowdown(1.0, 0, 0.0, ()).evidence == 0.0


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


def family_window(job: str, rate: float, end: float, partners: tuple[str, ...] = ()) -> Observation:
    return Observation(job, 0, end, 5.0, rate, "launches/s", partners)


def test_a_job_never_seen_alone_is_measured_against_its_familys_solo_rate():
    book = ObservationBook(smoothing=1.0)
    book.record(family_window("a", 100.0, 5.0), family="bert@A100")
    # b started next to a partner: no solo window of its own, yet a slowdown
    samples = book.record(family_window("b", 50.0, 5.0, ("c",)), family="bert@A100")
    assert [s.slowdown for s in samples] == pytest.approx([2.0])
    assert book.observed()["b"].reference == "family"
    assert not book.observed()["b"].solo_reference
    # another family, or a driver that does not say the family: no reference
    assert book.record(family_window("d", 50.0, 5.0, ("c",)), family="gpt2@A100") == []
    assert book.record(family_window("e", 50.0, 5.0, ("c",))) == []


def test_a_familys_solo_rate_outranks_a_profile_and_seeds_the_jobs_own():
    book = ObservationBook(smoothing=0.5)
    book.set_reference("b", 0, "launches/s", 125.0)  # a profile's T(c), 25% off
    book.record(family_window("a", 100.0, 5.0), family="bert@A100")
    book.record(family_window("b", 50.0, 5.0, ("c",)), family="bert@A100")
    assert book.observed()["b"].slowdown == pytest.approx(2.0)  # not 2.5
    # b's first solo window starts from the family's rate, not from the profile's
    book.record(family_window("b", 104.0, 10.0), family="bert@A100")
    assert book.reference("b", 0, "launches/s") == pytest.approx(102.0)
    assert book.observed()["b"].reference == "solo"
    # the family's rate averages many jobs' windows (one window moves it by a fifth)
    assert book.family_reference("bert@A100", 0, "launches/s") == pytest.approx(100.8)


def test_family_references_survive_a_restore():
    book = ObservationBook(smoothing=1.0)
    book.record(family_window("a", 100.0, 5.0), family="bert@A100")
    again = ObservationBook(smoothing=1.0)
    again.restore(book.state())
    assert again.family_reference("bert@A100", 0, "launches/s") == pytest.approx(100.0)
    again.record(family_window("b", 25.0, 5.0, ("c",)), family="bert@A100")
    assert again.observed()["b"].slowdown == pytest.approx(4.0)
    assert again.observed()["b"].reference == "family"
