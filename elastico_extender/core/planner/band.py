"""The closed loop's admission band: how far under tau a new co-location must be predicted.

While the loop is engaged (anything observed), a new co-location's S_hat times
``admit_margin`` must stay within every tenant's tau (``protect``'s module doc,
"Admission band").  A running pair stays while observed within tau, so admission
and separation thresholds form a hysteresis band.

A job of more than one GPU clears a wider band.  If its pair is separated, the
newer tenant goes back to the queue, and a requeued gang restarts only when as
many GPUs free at once: on the synthetic 64-GPU mix at load 1.5, 53 requeues of
8-GPU jobs waited 70 of the 92 hours all requeued jobs waited, and most
separations were false alarms of pairs truly within tau whose evidence the
borrowed reference's margin had raised over it (``benchmarks/results/loop``).  So
a gang must clear tau by the largest such margin as well (``PROFILE_MARGIN``): a
newcomer has not run alone at its configuration, and its evidence may be raised
by that much.  A one-GPU job restarts on the first GPU that frees and keeps the
narrow band, which a learned predictor's sharing needs (adding the margin for
every job left it behind not sharing at all).
"""

from __future__ import annotations

from elastico_extender.core.observations import PROFILE_MARGIN

__all__ = ["ADMIT_BAND", "WIDE_JOB_BAND", "admit_margin"]

ADMIT_BAND = 0.05
"""Relative margin below tau a new co-location's prediction must clear while the loop is
engaged: over three times the 1.5% scatter of a four-window mean at the simulator's 3%
window noise, so noise alone does not separate what was admitted."""
WIDE_JOB_BAND = PROFILE_MARGIN
"""Added to ``ADMIT_BAND`` for a job of more than one GPU (module doc)."""


def admit_margin(engaged: bool, gpus: int = 1, gang_band: bool = True) -> float:
    """The factor on S_hat in the admission screen of a job of ``gpus`` GPUs.

    1 with the loop disengaged; 1 + ``ADMIT_BAND`` for one GPU, and
    ``WIDE_JOB_BAND`` more for a gang (unless ``gang_band`` is off: the
    ``PlannerSettings.gang_band`` ablation), once anything is observed.
    """
    if not engaged:
        return 1.0
    return 1.0 + ADMIT_BAND + (WIDE_JOB_BAND if gpus > 1 and gang_band else 0.0)
