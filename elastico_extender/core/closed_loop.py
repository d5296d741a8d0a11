"""The closed loop's driver-side state, shared by the extender and the simulator.

One object per driver holds what the loop learns: the
:class:`~.observations.ObservationBook` (progress rates -> observed slowdowns,
read by the planner through ``Snapshot.observed``) and, optionally, the
:class:`~.interference.online.OnlineCorrection` in front of the base predictor
(pair samples -> corrected predictions).  :meth:`ClosedLoop.record` is the one
path from a window's observations to both, so the service (node-agent
reports) and the simulator (ground truth plus noise) cannot diverge.

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

__all__ = ["ClosedLoop", "LabelledPairs", "RunningConfig", "labelling_sample"]


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
    then holds the same pair: the window's slowdown is that pair's.  Otherwise the
    excess cannot be attributed.  Without this rule a multi-GPU job's own direction
    of its pairs was never learned (13% of shared windows on the 64-GPU load 1.5 mix
    had several partners, 28% of those were of this kind).
    """
    if len(samples) == 1:
        return samples[0]
    if not samples:
        return None
    victim = running.get(samples[0].victim)
    if victim is None or victim.crowded:
        return None
    kinds = set()
    for sample in samples:
        partner = running.get(sample.partner)
        if partner is None:
            return None
        kinds.add((partner.family, partner.config))
    return samples[0] if len(kinds) == 1 else None


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

        A window labels a pair only when its partners make one pair
        (``labelling_sample``) and both jobs' family and configuration are known
        (``running``).  Raises ValueError naming the field for an unusable
        observation (nothing of it is recorded).
        """
        found = []
        for obs in observations:
            job = running.get(obs.job_id)
            sample = labelling_sample(
                self.book.record(obs, job.family if job is not None else None), running
            )
            if sample is not None:
                found.append(sample)
        return self.teach(found, running, families)

    def teach(
        self,
        samples: Iterable[PairSample],
        running: Mapping[str, RunningConfig],
        families: Mapping[str, ProfileFamily],
    ) -> LabelledPairs:
        """Teach the correction the pairs ``samples`` label, one vectorised call.

        Each sample must be one its window labels (``labelling_sample``, the
        caller's rule, see :meth:`record`); a sample whose jobs' family or configuration is
        unknown is skipped.  The extender calls this with the samples its own
        bookkeeping took from the book; the simulator through :meth:`record`.
        """
        if self.correction is None:
            return LabelledPairs.empty()
        rows_a: list[np.ndarray] = []
        rows_b: list[np.ndarray] = []
        memory: list[float] = []
        labels: list[float] = []
        victims: list[str] = []
        partners: list[str] = []
        for sample in samples:
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
            labels.append(sample.slowdown)
            victims.append(sample.victim)
            partners.append(sample.partner)
        if not labels:
            return LabelledPairs.empty()
        x = pair_features(np.stack(rows_a), np.stack(rows_b), np.array(memory))
        y = np.array(labels)
        before = self.correction.learn(x, y)
        return LabelledPairs(x, y, before, tuple(victims), tuple(partners))

    def forget(self, job_ids: Iterable[str]) -> None:
        for job in job_ids:
            self.book.forget(job)
