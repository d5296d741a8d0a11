"""IAC screening of many configurations of one job in one predictor call.

Placing a job walks its configurations best score first and, for each one that
needs a shared GPU, predicts S_hat in both directions against the occupants of
the candidate devices (``Placer.predict_against``).  When the predictor refuses
most pairs (a learned model harsher than the profile-based default), a job can
walk dozens of configurations and make one predictor call, with its Python
set-up, per configuration: issue 14 measured ~197k placement calls in 25 plans.

:class:`OptionScreen` asks every (configuration, distinct occupant) pair of
the remaining configurations at once and answers each configuration's
screen by indexing.  The answer is the same as ``predict_against`` per
configuration: the same pairs, the same tolerances, only batched (predictors
answer row by row, so the batch does not change a row's value).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from elastico_extender.core.interference.features import pair_features

if TYPE_CHECKING:
    from elastico_extender.core.planner.placement import Placer

__all__ = ["OptionScreen"]


class OptionScreen:
    """Predicted slowdowns of ``configs`` of one job next to the occupants of ``devices``."""

    def __init__(
        self,
        placer: Placer,
        devices: np.ndarray,
        configs: Sequence[int],
        features: np.ndarray,
    ) -> None:
        table = placer.table
        occupants = table.occupants
        pair_device: list[int] = []
        partners: list[int] = []
        for d in devices.tolist():
            members = occupants.get(d, ())
            pair_device.extend([d] * len(members))
            partners.extend(members)
        self.placer = placer
        self.pair_device = np.array(pair_device, dtype=np.intp)
        self.partners = np.array(partners, dtype=np.intp)
        self.slot = {c: i for i, c in enumerate(configs)}
        self.s_new = np.ones((len(configs), 0))
        self.s_old = np.ones((len(configs), 0))
        self.inverse = np.zeros(0, dtype=np.intp)
        if not partners or placer.predictor is None:
            return
        memory = (table.memory_total[self.pair_device] / 1024.0).astype(np.float32)
        keys = np.ascontiguousarray(
            np.concatenate([placer.features[self.partners], memory[:, None]], axis=1)
        )
        void = keys.view(np.dtype((np.void, keys.dtype.itemsize * keys.shape[1]))).ravel()
        _, first, inverse = np.unique(void, return_index=True, return_inverse=True)
        self.inverse = inverse.reshape(-1)
        theirs = placer.features[self.partners[first]]
        mem = memory[first]
        u, o = first.size, len(configs)
        mine = np.repeat(np.asarray(features, dtype=np.float32)[list(configs)], u, axis=0)
        theirs_all = np.tile(theirs, (o, 1))
        mem_all = np.tile(mem, o)
        x = np.concatenate(
            [pair_features(mine, theirs_all, mem_all), pair_features(theirs_all, mine, mem_all)]
        )
        s = np.asarray(placer.predictor.predict(x), dtype=np.float64)
        self.s_new = s[: o * u].reshape(o, u)
        self.s_old = s[o * u :].reshape(o, u)

    def covers(self, config: int) -> bool:
        return config in self.slot

    def verdict(
        self, config: int, checked: np.ndarray, tolerance: float, margin: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each of ``checked`` (devices): (safe?, newcomer's worst S_hat), as
        ``Placer.predict_against`` answers for ``config`` at the admission band ``margin``."""
        safe = np.ones(len(checked), dtype=bool)
        worst = np.ones(len(checked))
        if self.placer.predictor is None or self.pair_device.size == 0 or len(checked) == 0:
            return safe, worst
        position = np.full(self.placer.table.size, -1, dtype=np.intp)
        position[checked] = np.arange(len(checked))
        at = position[self.pair_device]
        sel = at >= 0
        if not sel.any():
            return safe, worst
        k = self.slot[config]
        key = self.inverse[sel]
        return self.placer.verdict(
            at[sel],
            len(checked),
            self.s_new[k, key],
            self.s_old[k, key],
            tolerance,
            self.partners[sel],
            self.pair_device[sel],
            margin,
        )
