"""The closed loop's admission band: how far under tau a new co-location must be predicted.

While the loop is engaged (anything observed), a new co-location's S_hat times
``admit_margin`` must stay within every tenant's tau (``protect``'s module doc,
"Admission band").  A running pair stays while observed within tau, so admission
and separation thresholds form a hysteresis band.

A job of more than one GPU may be made to clear a wider band
(``PlannerSettings.gang_band``, off by default).  If its pair is separated, the
newer tenant goes back to the queue, and a requeued gang restarts only when as
many GPUs free at once: on the synthetic 64-GPU mix at load 1.5, 53 requeues of
8-GPU jobs waited 70 of the 92 hours all requeued jobs waited, and most
separations were false alarms of pairs truly within tau whose evidence a
borrowed reference's margin had raised over it.  With the setting on, a gang
must clear tau by the largest such margin as well (``PROFILE_MARGIN``).  It is
off because that trade, queueing for requeues, is the trace's to decide: on the
synthetic mix at load 1.5 it lowers average JCT, on real Philly weeks gangs
refused a shared GPU wait in the queue longer than the requeues it spares cost
(``benchmarks/results/loop/README.md``, "Session 31").
"""

from __future__ import annotations

from elastico_extender.core.observations import PROFILE_MARGIN

__all__ = ["ADMIT_BAND", "WIDE_JOB_BAND", "admit_margin"]

ADMIT_BAND = 0.05
"""Relative margin below tau a new co-location's prediction must clear while the loop is
engaged: over three times the 1.5% scatter of a four-window mean at the simulator's 3%
window noise, so noise alone does not separate what was admitted."""
WIDE_JOB_BAND = PROFILE_MARGIN
"""Added to ``ADMIT_BAND`` for a job of more than one GPU where ``gang_band`` is on."""


def admit_margin(engaged: bool, gpus: int = 1, gang_band: bool = False) -> float:
    """The factor on S_hat in the admission screen of a job of ``gpus`` GPUs.

    1 with the loop disengaged; 1 + ``ADMIT_BAND`` for one GPU, and
    ``WIDE_JOB_BAND`` more for a gang where ``gang_band`` is on
    (``PlannerSettings.gang_band``), once anything is observed.
    """
    if not engaged:
        return 1.0
    return 1.0 + ADMIT_BAND + (WIDE_JOB_BAND if gpus > 1 and gang_band else 0.0)
