"""The closed loop's driver-side state, shared by the extender and the simulator.

One object per driver holds what the loop learns: the
:class:`~.observations.ObservationBook` (progress rates -> observed slowdowns,
read by the planner through ``Snapshot.observed``) and, optionally, the
:class:`~.interference.online.OnlineCorrection` in front of the base predictor
(pair samples -> corrected predictions).  :meth:`ClosedLoop.record` is the one
path from a window's observations to both, so the service (node-agent
reports) and the simulator (ground truth plus noise) cannot diverge.

Which pair a window labels (``ClosedLoop.label``): a window with one partner labels
that pair.  A multi-GPU job synchronises every step, so it runs at its slowest
device's pace: with one partner per device its window's slowdown is its worst
pair's, and no pair's is more.  Such a window labels the pair its partners make
when they all run one family and configuration (``labelling_sample``); with
partners of several kinds, the one pair not yet known when every other pair is
known (``KNOWN_WINDOWS`` windows of its own) and predicted clearly below the window
(``ATTRIBUTION_MARGIN``): the excess can only be that pair's
(``ClosedLoop.attribute``).  Otherwise it labels nothing: a guess, such as the pair
ranked worst, labels the wrong pair whenever the ranking is wrong, and a pair
labelled too high is refused from then on, so no window of its own ever corrects it.

Pure: no I/O and no clock (the driver passes times inside the observations);
persistence is the driver's, through :meth:`ObservationBook.state` and
:meth:`OnlineCorrection.rows` (see ``profiles/loop_store.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES, pair_features
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.model import ProfileFamily
from elastico_extender.core.observations import (
    Observation,
    ObservationBook,
    ObservedSlowdown,
    PairSample,
)

__all__ = [
    "ATTRIBUTION_MARGIN",
    "KNOWN_WINDOWS",
    "ClosedLoop",
    "LabelledPairs",
    "RunningConfig",
    "attributable",
    "labelling_sample",
]

KNOWN_WINDOWS = 2
"""Windows of a configuration pair's own after which its corrected prediction counts as
known (``ClosedLoop.attribute``): the observation a step-down needs (planner.protect)."""
ATTRIBUTION_MARGIN = 0.05
"""How far below a window's slowdown every known pair's corrected prediction must lie
for the window to be attributed to the one unknown pair (``ClosedLoop.attribute``):
the admission band (planner.protect), so a known pair that one window's measurement
error (3% in the simulator) could make the slow one is not taken for innocent.
Without it 1 of 8 runs of the loop tables read 1.3% worse (load 1.0 seed 0)."""


@dataclass(frozen=True, slots=True)
class RunningConfig:
    """What the loop needs of a running job to label its pairs: family and configuration."""

    family: str
    config: int
    device_memory_gib: float = 40.0
    crowded: bool = False
    """Some device of the job holds two or more of its partners (their excesses add up
    there, so its windows label no single pair; ``labelling_sample``)."""


def labelling_sample(
    samples: Sequence[PairSample], running: Mapping[str, RunningConfig]
) -> PairSample | None:
    """The pair a window labels, of the samples it gave (one per partner), or None.

    One partner: that pair.  Several: only when no device of the victim holds two
    of them (``RunningConfig.crowded``) and they all run one family and
    configuration.  A multi-GPU job synchronises every step (data- and
    tensor-parallel alike), so it runs at its slowest device's pace, and each device
    then holds the same pair: the window's slowdown is that pair's.  Otherwise it
    cannot tell which pair (``ClosedLoop.attribute`` may).  Without this rule
    a multi-GPU job's own direction of its pairs was never learned (13% of shared
    windows on the 64-GPU load 1.5 mix had several partners, 28% of those were of
    this kind).
    """
    return _labelled(samples, running)[0]


def _labelled(
    samples: Sequence[PairSample], running: Mapping[str, RunningConfig]
) -> tuple[PairSample | None, bool]:
    """(``labelling_sample``'s answer, whether a window it leaves undecided is
    ``attributable``): the rule once, ``attributable`` asked once per window."""
    if len(samples) == 1:
        return samples[0], False
    if not attributable(samples, running):
        return None, False
    kinds = {(running[s.partner].family, running[s.partner].config) for s in samples}
    return (samples[0], False) if len(kinds) == 1 else (None, True)


def attributable(samples: Sequence[PairSample], running: Mapping[str, RunningConfig]) -> bool:
    """Whether a window with several partners can speak of one of its pairs at all
    (``labelling_sample``, ``ClosedLoop.attribute``): the victim and every partner are
    running jobs the loop knows, each partner on a device of its own (the victim is
    not ``crowded``)."""
    if len(samples) < 2:
        return False
    victim = running.get(samples[0].victim)
    return (
        victim is not None
        and not victim.crowded
        and all(sample.partner in running for sample in samples)
    )


@dataclass(frozen=True, slots=True)
class LabelledPairs:
    """One window's learnable pairs: features (P, 36), observed S, the prediction before."""

    features: np.ndarray
    observed: np.ndarray
    predicted: np.ndarray
    victims: tuple[str, ...]
    partners: tuple[str, ...]

    @classmethod
    def empty(cls) -> LabelledPairs:
        z = np.zeros(0)
        return cls(np.zeros((0, NUM_FEATURES), dtype=np.float32), z, z, (), ())


class ClosedLoop:
    """Observation book plus optional online correction (module doc)."""

    def __init__(
        self,
        correction: OnlineCorrection | None = None,
        book: ObservationBook | None = None,
    ) -> None:
        self.book = book or ObservationBook()
        self.correction = correction

    def observed(self) -> dict[str, ObservedSlowdown]:
        return self.book.observed()

    def record(
        self,
        observations: Iterable[Observation],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> LabelledPairs:
        """Feed one window's observations; teach the correction the pairs they label.

        Which pair a window labels is :meth:`label`'s (module doc); a pair is taught
        only when both jobs' family and configuration are known (``running``).  Raises
        ValueError naming the field for an unusable observation (nothing of it is
        recorded).
        """
        windows = []
        for obs in observations:
            job = running.get(obs.job_id)
            windows.append(self.book.record(obs, job.family if job is not None else None))
        return self.learn(windows, running, families)

    def learn(
        self,
        windows: Sequence[Sequence[PairSample]],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> LabelledPairs:
        """Teach the correction what ``windows`` (each window's pair samples, as the book
        returned them) label: :meth:`label`, then :meth:`teach`.  The simulator comes here
        through :meth:`record`; the extender, which records windows itself, directly."""
        return self.teach(self.label(windows, running, families), running, families)

    def label(
        self,
        windows: Sequence[Sequence[PairSample]],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> list[PairSample]:
        """The pair each window labels, in order, for the windows that label one (module
        doc): ``labelling_sample`` where it decides, ``attribute`` for the rest."""
        found: list[PairSample] = []
        mixed: list[Sequence[PairSample]] = []
        for samples in windows:
            sample, undecided = _labelled(samples, running)
            if sample is not None:
                found.append(sample)
            elif undecided:
                mixed.append(samples)
        return found + self.attribute(mixed, running, families)

    def attribute(
        self,
        windows: Sequence[Sequence[PairSample]],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> list[PairSample]:
        """Per window (``attributable``) whose excess only one of its pairs can explain,
        that pair's sample (module doc): every other pair known, each predicted below
        the window's slowdown by ``ATTRIBUTION_MARGIN``.  One predictor call and one
        lookup for all windows; without a correction nothing is known, or taught."""
        if self.correction is None or not windows:
            return []
        flat = [sample for samples in windows for sample in samples]
        x, kept = _pair_rows(flat, running, families)
        present = np.zeros(len(flat), dtype=bool)  # a pair without features: window left out
        present[kept] = True
        predicted = np.full(len(flat), np.inf)
        known = np.zeros(len(flat), dtype=bool)
        if kept:
            predicted[kept] = np.asarray(self.correction.predict(x), dtype=np.float64)
            known[kept] = np.asarray(self.correction.observed_windows(x)) >= KNOWN_WINDOWS
        chosen: list[PairSample] = []
        start = 0
        for samples in windows:
            span = slice(start, start + len(samples))
            start += len(samples)
            mine = known[span]
            if not present[span].all() or np.count_nonzero(~mine) != 1:
                continue
            limit = samples[0].slowdown / (1.0 + ATTRIBUTION_MARGIN)
            if np.all(predicted[span][mine] < limit):
                chosen.append(samples[int(np.flatnonzero(~mine)[0])])
        return chosen

    def teach(
        self,
        samples: Iterable[PairSample],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> LabelledPairs:
        """Teach the correction the pairs ``samples`` label, one vectorised call.

        Each sample must be one its window labels (:meth:`label`; both drivers come
        through :meth:`learn`); a sample whose jobs' family or configuration is
        unknown is skipped.
        """
        if self.correction is None:
            return LabelledPairs.empty()
        samples = list(samples)
        x, kept = _pair_rows(samples, running, families)
        if not kept:
            return LabelledPairs.empty()
        taught = [samples[k] for k in kept]
        y = np.array([sample.slowdown for sample in taught])
        before = self.correction.learn(x, y)
        return LabelledPairs(
            x,
            y,
            before,
            tuple(sample.victim for sample in taught),
            tuple(sample.partner for sample in taught),
        )

    def forget(self, job_ids: Iterable[str]) -> None:
        for job in job_ids:
            self.book.forget(job)


def _pair_rows(
    samples: Sequence[PairSample],
    running: Mapping[str, RunningConfig],
    families: Mapping[str, ProfileFamily],
) -> tuple[np.ndarray, list[int]]:
    """The 36 IAC features of each sample's pair (victim's configuration in its window,
    partner's current one), and the indices of the samples they belong to: a sample
    whose jobs' family or configuration is unknown has no row."""
    rows_a: list[np.ndarray] = []
    rows_b: list[np.ndarray] = []
    memory: list[float] = []
    kept: list[int] = []
    for k, sample in enumerate(samples):
        mine, theirs = running.get(sample.victim), running.get(sample.partner)
        if mine is None or theirs is None:
            continue
        fam_a, fam_b = families.get(mine.family), families.get(theirs.family)
        if fam_a is None or fam_b is None:
            continue
        if not (0 <= sample.victim_config < fam_a.size and 0 <= theirs.config < fam_b.size):
            continue
        rows_a.append(fam_a.features[sample.victim_config])
        rows_b.append(fam_b.features[theirs.config])
        memory.append(mine.device_memory_gib)
        kept.append(k)
    if not kept:
        return np.zeros((0, NUM_FEATURES), dtype=np.float32), kept
    return pair_features(np.stack(rows_a), np.stack(rows_b), np.array(memory)), kept
