"""More than two tenants on a GPU: pairwise predictions compose additively.

Every pair below tau is not enough: three jobs that each slow the other by 1.3x
run at about 1.6x together (the excesses add, as time-slicing adds them), so a
third tenant that every pair tolerates must still be refused.
"""

from __future__ import annotations

import numpy as np
from conftest import Constant, a100_nodes

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.placement import Placer, device_slowdown
from elastico_extender.core.planner.screening import OptionScreen


def test_excesses_of_one_victims_partners_add():
    composed = device_slowdown(np.array([0.3, 0.3, 0.2, -0.1]), np.array([0, 0, 1, 1]), 3)
    # a predicted speed-up (S < 1) adds nothing; a group without pairs is alone
    assert np.allclose(composed, [1.6, 1.2, 1.0])


def _placer_with_one_and_two_tenants(families) -> tuple[Placer, Constant]:
    predictor = Constant(1.3)
    placer = Placer(DeviceTable(a100_nodes(1, 2), 512.0), predictor, rows=8)
    fam = families["ncf"]
    lean = int(np.argmin(fam.resources[:, 1]))
    for row, device in ((0, 0), (1, 1), (2, 1)):  # device 0: one tenant, device 1: two
        placer.commit(row, lean, [device], fam.resources[lean], fam.features[lean], 1.5)
    return placer, predictor


def test_a_third_tenant_every_pair_tolerates_is_refused(families):
    placer, _ = _placer_with_one_and_two_tenants(families)
    fam = families["ncf"]
    devices = np.array([0, 1])
    safe, worst = placer.predict_against(devices, fam.features[0], 1.5)
    assert safe.tolist() == [True, False]  # pairwise 1.3 < 1.5 both, composed 1.6 on device 1
    assert np.allclose(worst, [1.3, 1.6])
    # The batched screen answers the same.
    screen = OptionScreen(placer, devices, [0, 1], fam.features)
    got_safe, got_worst = screen.verdict(0, devices, 1.5, placer.margin_for(1))
    assert got_safe.tolist() == [True, False] and np.allclose(got_worst, [1.3, 1.6])
    # A newcomer who could take it (tau 2) is still refused: the occupants could not.
    safe, _ = placer.predict_against(devices, fam.features[0], 2.0)
    assert safe.tolist() == [True, False]


def test_occupants_excess_is_predicted_once_per_device_state(families):
    placer, predictor = _placer_with_one_and_two_tenants(families)
    fam = families["ncf"]
    devices = np.array([1])
    placer.predict_against(devices, fam.features[0], 1.5)
    first = predictor.asked
    placer.predict_against(devices, fam.features[0], 1.5)
    assert predictor.asked - first == 2  # the newcomer both ways (twin occupants); cached
    placer.release(2, fam.resources[int(placer.config[2])])  # the device changed
    safe, worst = placer.predict_against(devices, fam.features[0], 1.5)
    assert safe.tolist() == [True] and np.allclose(worst, [1.3])


def test_the_planner_does_not_pile_a_third_job_onto_a_pair(families):
    """Three lean jobs fit one GPU by memory; each pair is predicted at 1.3x, within
    tau 1.5, but three together would run at 1.6x: only two share, one waits."""
    jobs = tuple(Job(f"ncf-{i}", "ncf", arrival_time=float(i)) for i in range(3))
    snapshot = Snapshot(a100_nodes(1, 1), jobs, families)
    result = plan(snapshot, predictor=Constant(1.3))
    assert len(result.assignments) == 2, result.assignments
    assert len(result.queued) == 1
    for a in result.assignments.values():
        assert a.predicted_slowdown <= a.tolerance + 1e-9


def test_the_extenders_filter_refuses_the_third_tenant_too(families):
    """Filter/prioritize between epochs (PlacementView, what the extender answers
    kube-scheduler with) compose the same way as the epoch: a one-GPU node holding two
    lean jobs takes a third only if all three stay within tau together."""
    from elastico_extender.core.planner import PlacementView

    pair = tuple(Job(f"ncf-{i}", "ncf", arrival_time=float(i)) for i in range(2))
    snapshot = Snapshot(a100_nodes(1, 1), pair, families)
    planned = plan(snapshot, predictor=Constant(1.0))
    assert len(planned.assignments) == 2  # both share the only GPU
    running = tuple(
        Job(
            a_id,
            "ncf",
            current_config=planned.assignments[a_id].config_index,
            devices=planned.assignments[a_id].devices,
            arrival_time=job.arrival_time,
        )
        for a_id, job in ((j.id, j) for j in pair)
    )
    current = Snapshot(a100_nodes(1, 1), running, families, epoch=1)
    newcomer = Job("ncf-2", "ncf", arrival_time=2.0)
    tau = min(a.tolerance for a in planned.assignments.values())
    # Each pair well within tau: together within it, then (each pair 70% of the way) over.
    fits, over = 1.0 + 0.45 * (tau - 1.0), 1.0 + 0.7 * (tau - 1.0)
    for level, feasible in ((fits, True), (over, False)):
        view = PlacementView(current, planned, predictor=Constant(level))
        verdict = view.evaluate(newcomer, families["ncf"])["node-0"]
        assert verdict.feasible == feasible, (level, tau, verdict)
    assert f"slowdown {1.0 + 2 * (over - 1.0):.2f}x" in verdict.reason
