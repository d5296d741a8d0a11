"""The planner's columnar fast paths answer exactly what the plain definitions do.

Each fast path (per-family tables read per job, node-level idle choice, bulk
commits, row-restricted scores, assignments built on read, memoised device
index, per-field job columns) is checked against the straightforward
computation it replaces, on random inputs, so a future edit cannot make the
two drift apart unnoticed.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import a100_nodes

from elastico_extender.core.model import (
    Action,
    AssignmentColumns,
    GpuDevice,
    Job,
    JobKind,
    Mode,
    Node,
    Snapshot,
    device_index,
    job_columns,
)
from elastico_extender.core.planner import plan
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.tables import PerJob
from elastico_extender.core.pricing.scoring import PricingProblem
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, NUM_RESOURCES


def test_per_job_view_reads_like_the_materialised_array():
    rng = np.random.default_rng(0)
    table = rng.random((3, 5, NUM_RESOURCES))
    family = rng.integers(0, 3, size=7)
    dense = table[family]  # (7, 5, R), what the view stands for
    view = PerJob(table, family)
    rows = np.array([6, 0, 3, 3])
    configs = np.array([4, 0, 2, 1])
    assert view.shape == dense.shape
    assert np.array_equal(view[2], dense[2])
    assert np.array_equal(view[rows, configs], dense[rows, configs])
    assert np.array_equal(view[rows, configs, GPU_MEM], dense[rows, configs, GPU_MEM])
    assert view[5, 3, GPU_SM] == dense[5, 3, GPU_SM]


def random_table(seed: int) -> DeviceTable:
    """A cluster with mixed node sizes, half-used devices and some tight nodes."""
    rng = np.random.default_rng(seed)
    nodes = []
    for i in range(int(rng.integers(2, 9))):
        memory = float(rng.choice([24576.0, 40960.0, 81920.0]))
        gpus = tuple(GpuDevice(g, memory) for g in range(int(rng.integers(1, 9))))
        nodes.append(Node(f"n{i}", gpus, cpu_cores=float(rng.integers(4, 65))))
    table = DeviceTable(tuple(nodes), 512.0)
    for row in range(int(rng.integers(0, table.size + 1))):
        d = int(rng.integers(table.size))
        demand = np.array([rng.random() * 0.5, rng.random() * 8000.0, 1.0, 1024.0])
        if table.fits_on([d], demand):
            table.place(row, [d], demand)
    return table


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("best_fit", [True, False])
def test_idle_device_chosen_per_node_matches_the_per_device_choice(seed, best_fit):
    table = random_table(seed)
    rng = np.random.default_rng(seed + 100)
    for _ in range(20):
        demand = np.array([rng.random(), rng.random() * 90000.0, rng.random() * 70.0, 2048.0])
        fast = table.choose_idle(demand, best_fit)
        fits = table.fits(demand)
        idle = fits & (table.count == 0)
        if not idle.any():
            assert fast is None
            continue
        assert fast == table.choose(fits, demand, 1, best_fit)[0]


def test_idle_choice_defers_to_devices_when_a_node_mixes_sizes():
    node = Node("mixed", (GpuDevice(0, 24576.0), GpuDevice(1, 81920.0)))
    table = DeviceTable((node,), 512.0)
    demand = np.array([0.5, 40000.0, 1.0, 1024.0])  # fits the 80 GB device only
    assert table.choose_idle(demand, True) is False
    assert table.choose(table.fits(demand), demand, 1, True) == [1]


def test_bulk_placement_books_exactly_what_one_by_one_placement_does():
    rng = np.random.default_rng(3)
    nodes = a100_nodes(4, 4)
    bulk, single = DeviceTable(nodes, 512.0), DeviceTable(nodes, 512.0)
    for unique in (True, False):  # one worker per device (fast path), then shared devices
        devices = rng.permutation(16)[:10] if unique else rng.integers(0, 16, size=10)
        rows = np.arange(10) + (0 if unique else 10)
        demand = rng.random((10, NUM_RESOURCES)) * [0.1, 1000.0, 1.0, 100.0]
        bulk.place_many(rows, devices, demand)
        for row, d, need in zip(rows.tolist(), devices.tolist(), demand, strict=True):
            single.place(row, [d], need)
        for name in ("mem_free", "sm_free", "cpu_free", "ram_free", "count", "idle_per_node"):
            assert np.allclose(getattr(bulk, name), getattr(single, name)), name
        assert {d: sorted(r) for d, r in bulk.occupants.items() if r} == {
            d: sorted(r) for d, r in single.occupants.items() if r
        }


def test_bulk_placement_next_to_an_occupant_keeps_both():
    table = DeviceTable(a100_nodes(1, 2), 512.0)
    need = np.array([0.2, 1000.0, 1.0, 100.0])
    table.place(0, [1], need)
    table.place_many(np.array([7]), np.array([1]), need[None, :])
    assert sorted(table.occupants[1]) == [0, 7] and table.count[1] == 2


def test_scores_for_some_rows_equal_those_rows_of_all_scores():
    rng = np.random.default_rng(1)
    n, f, k = 9, 3, 6
    problem = PricingProblem(
        demand=rng.random((NUM_RESOURCES, f, k)),
        base=rng.random((n, k)),
        wait_score=np.ones(n),
        capacity=np.ones(NUM_RESOURCES),
        reserve=np.zeros((NUM_RESOURCES, n)),
        family=rng.integers(0, f, size=n),
        gpus=rng.integers(1, 4, size=n).astype(float),
    )
    rows = np.array([8, 2, 2, 5])
    for prices in (np.zeros(NUM_RESOURCES), rng.random(NUM_RESOURCES)):
        for penalty in (None, rng.random((n, k))):
            full = problem.scores(prices, penalty)
            assert np.allclose(problem.scores(prices, penalty, rows=rows), full[rows])
    # The factored demand is the dense D_j(c) = gpus_j * demand[:, family_j, c].
    dense = problem.demand[:, problem.family] * problem.gpus[None, :, None]
    prices = rng.random(NUM_RESOURCES)
    expected = problem.base + np.einsum("r,rnk->nk", prices, dense)
    assert np.allclose(problem.scores(prices), expected)


def test_assignments_read_before_and_after_bulk_build_are_the_same_records(families):
    nodes = a100_nodes(2, 4)
    jobs = tuple(Job(f"j{i}", "resnet50") for i in range(6))
    first = plan(Snapshot(nodes, jobs, families))
    running = tuple(
        Job(
            j.id,
            j.family,
            current_config=first.assignments[j.id].config_index,
            devices=first.assignments[j.id].devices,
        )
        for j in jobs
    )
    arrivals = (Job("late", "bert"),)
    result = plan(Snapshot(nodes, running + arrivals, families), first)
    assignments = result.assignments
    assert isinstance(assignments, AssignmentColumns)
    one_by_one = {job_id: assignments[job_id] for job_id in list(assignments)}
    assert "late" in assignments and "ghost" not in assignments
    assert assignments.get("ghost") is None
    assert dict(assignments.items()) == one_by_one  # bulk path, built after the lookups
    assert assignments == one_by_one and len(assignments) == 7
    assert [a.job_id for a in assignments.changed()] == [
        a.job_id for a in one_by_one.values() if a.action is not Action.KEEP
    ]
    assert one_by_one["late"].action is Action.ADMIT
    with pytest.raises(KeyError):
        assignments["ghost"]


def test_device_index_is_built_once_per_nodes_tuple_and_reports_bad_nodes():
    nodes = a100_nodes(3, 2)
    assert device_index(nodes) is device_index(nodes)
    assert device_index(tuple(list(nodes))) is not device_index(nodes)  # a new tuple: rebuilt
    index = device_index(nodes)
    assert index.refs[index.index[("node-2", 1)]] == ("node-2", 1)
    bad = (Node("x", (GpuDevice(0, float("nan")),)), Node("x", (GpuDevice(0, 1.0),)))
    problems = device_index(bad).problems
    assert "duplicate node names" in problems and any("bad memory" in p for p in problems)


def test_job_columns_hold_each_field_in_row_order():
    jobs = (
        Job("a", "bert", JobKind.TRAINING, gpus=2, weight=0.5, arrival_time=3.0),
        Job("b", "alpha", mode=Mode.FIXED, allowed=(1,), current_config=1, devices=(("n", 0),)),
        Job("c", "bert", min_throughput=7.0),
    )
    cols = job_columns(jobs)
    assert cols.gpus.tolist() == [2.0, 1.0, 1.0]
    assert cols.weight.tolist() == [0.5, 1.0, 1.0]
    assert cols.floor.tolist() == [0.0, 0.0, 7.0]
    assert cols.held.tolist() == [0, 1, 0]
    assert cols.current.tolist() == [-1, 1, -1]
    assert cols.fixed.tolist() == [False, True, False]
    assert cols.arrival.tolist() == [3.0, 0.0, 0.0]
    assert cols.family_names == ("alpha", "bert")
    assert cols.family_code.tolist() == [1, 0, 1]
    assert cols.restricted.tolist() == [1]
    empty = job_columns(())
    assert empty.gpus.shape == (0,) and empty.current.shape == (0,)


def test_unknown_worker_devices_are_reported_per_job(families):
    nodes = a100_nodes(1, 1)
    ghost = Job("g", "bert", current_config=0, devices=(("nowhere", 3),))
    snapshot = Snapshot(nodes, (Job("ok", "bert"), ghost), families)
    assert snapshot.workers.tolist() == [-1]
    with pytest.raises(Exception, match="unknown device nowhere/gpu3"):
        snapshot.validate()


def test_node_capacity_columns_follow_the_nodes():
    nodes = (
        Node("a", (GpuDevice(0, 40960.0), GpuDevice(1, 81920.0)), cpu_cores=8.0),
        Node("b", ()),
        Node("c", (GpuDevice(0, 24576.0),), host_mem_mib=1024.0),
    )
    table = DeviceTable(nodes, 512.0)
    assert table.node_start.tolist() == [0, 2, 2]
    assert table.node_cap_min.tolist() == [40448.0, 0.0, 24064.0]
    assert table.node_cap_max.tolist() == [81408.0, 0.0, 24064.0]
    assert table.cpu_free[0] == 8.0 and table.ram_free[2] == 1024.0
    demand = np.zeros(NUM_RESOURCES)
    demand[[GPU_MEM, CPU, HOST_MEM]] = [1.0, 1.0, 1.0]
    assert table.choose_idle(demand, True) == 2  # node c has the fewest idle GPUs


def test_placement_view_books_the_plan_as_one_by_one_commits_would(families):
    from elastico_extender.core.planner import PlacementView
    from elastico_extender.core.planner.placement import Placer

    nodes = a100_nodes(2, 4)
    names = ["resnet50", "bert", "dcgan", "transformer"]
    jobs = tuple(Job(f"j{i}", names[i % 4], gpus=2 if i % 5 == 0 else 1) for i in range(14))
    snapshot = Snapshot(nodes, jobs, families)
    result = plan(snapshot)
    view = PlacementView(snapshot, result)
    reference = DeviceTable(nodes, view.settings.memory_margin_mib)
    placer = Placer(reference, None)
    for row, a in enumerate(result.assignments.values()):
        family = families[snapshot.jobs[[j.id for j in jobs].index(a.job_id)].family]
        devices = [reference.index[ref] for ref in a.devices]
        placer.commit(
            row, a.config_index, devices, family.resources[a.config_index],
            family.features[a.config_index], a.tolerance,
        )  # fmt: skip
    for name in ("mem_free", "sm_free", "cpu_free", "ram_free", "count"):
        assert np.allclose(getattr(view.table, name), getattr(reference, name)), name
    for job_id in result.assignments:
        assert view.holds(job_id)
        assert view.devices_of(job_id) == result.assignments[job_id].devices
    assert np.any(view.table.count >= 2)  # the scenario does exercise shared devices


def test_tenant_pairs_come_in_the_order_devices_were_first_occupied():
    """The interference check, repair and spread visit shared devices in this order;
    a victim's pairs on one device are one contiguous group."""
    from elastico_extender.core.planner.devices import tenant_pairs

    table = DeviceTable(a100_nodes(1, 4), 512.0)
    need = np.array([0.1, 1000.0, 1.0, 100.0])
    for row, device in enumerate([3, 1, 3, 1, 0, 3]):
        table.place(row, [device], need)
    victims, partners, where, groups = tenant_pairs(table, list(table.occupants))
    assert victims.tolist() == [0, 0, 2, 2, 5, 5, 1, 3]
    assert partners.tolist() == [2, 5, 0, 5, 0, 2, 3, 1]
    assert where.tolist() == [3, 3, 3, 3, 3, 3, 1, 1]
    assert groups.tolist() == [0, 0, 1, 1, 2, 2, 3, 4]


def test_placement_view_from_plan_rows_equals_the_view_matched_by_job_id(families):
    """The view's bulk path (plan rows over the snapshot's workers) books what the
    per-record path does, for kept, reconfigured, moved and newly admitted jobs."""
    import dataclasses

    from elastico_extender.core.planner import PlacementView

    nodes = a100_nodes(3, 4)
    names = ["resnet50", "bert", "dcgan", "transformer"]
    jobs = tuple(Job(f"j{i}", names[i % 4], gpus=2 if i % 3 == 0 else 1) for i in range(12))
    first = plan(Snapshot(nodes, jobs, families))
    running = tuple(
        dataclasses.replace(
            j,
            current_config=first.assignments[j.id].config_index,
            devices=first.assignments[j.id].devices,
        )
        for j in jobs
        if j.id in first.assignments
    )
    arrivals = tuple(Job(f"new{i}", names[i % 4], gpus=1 + i % 2) for i in range(6))
    snapshot = Snapshot(nodes, running + arrivals, families, epoch=2)
    result = plan(snapshot, first)
    assert result.assignments.rows_in(snapshot.jobs) is not None
    assert result.assignments.rows_in(tuple(snapshot.jobs)) is not None  # same tuple
    assert result.assignments.rows_in(tuple(list(snapshot.jobs))) is None  # another tuple
    actions = {a.action for a in result.assignments.values()}
    assert Action.KEEP in actions and Action.ADMIT in actions
    bulk = PlacementView(snapshot, result)
    records = dataclasses.replace(result, assignments=dict(result.assignments))
    by_id = PlacementView(snapshot, records)
    for name in ("mem_free", "sm_free", "cpu_free", "ram_free", "count"):
        assert np.array_equal(getattr(bulk.table, name), getattr(by_id.table, name)), name
    assert dict(bulk.table.occupants) == dict(by_id.table.occupants)  # same order too
    assert bulk._rows == by_id._rows
    rows = np.arange(len(result.assignments))
    assert np.array_equal(bulk.placer.config[rows], by_id.placer.config[rows])
    assert np.array_equal(bulk.placer.features[rows], by_id.placer.features[rows])
    assert np.array_equal(bulk.placer.tolerance[rows], by_id.placer.tolerance[rows])
    for job_id, a in result.assignments.items():
        assert bulk.devices_of(job_id) == by_id.devices_of(job_id) == a.devices
    two_gpu = next(j.id for j in running if j.gpus == 2)
    assert bulk.forget(two_gpu) and by_id.forget(two_gpu)  # releases the plan's demand
    assert np.array_equal(bulk.table.mem_free, by_id.table.mem_free)
    assert not bulk.holds(two_gpu)
