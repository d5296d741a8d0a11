"""ESP: the scoring function and the price update (spec 3.2), table-driven."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.pricing.scoring import PricingProblem, select
from elastico_extender.core.pricing.tatonnement import tatonnement
from elastico_extender.core.resources import GPU_MEM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings, StepSchedule


def two_config_problem(jobs: int, capacity_mem: float) -> PricingProblem:
    """Each job: config 0 fast and big (1.0 GPU-eq of memory), config 1 slower, half the size."""
    demand = np.zeros((NUM_RESOURCES, jobs, 2))
    demand[GPU_MEM, :, 0] = 1.0
    demand[GPU_MEM, :, 1] = 0.5
    base = np.tile(np.array([0.0, 0.2]), (jobs, 1))  # 20% throughput loss when shrunk
    capacity = np.full(NUM_RESOURCES, 100.0)
    capacity[GPU_MEM] = capacity_mem
    return PricingProblem(
        demand=demand,
        base=base,
        wait_score=np.full(jobs, np.inf),
        capacity=capacity,
        reserve=np.zeros((NUM_RESOURCES, jobs)),
    )


def test_no_scarcity_no_price_and_every_job_takes_its_fastest_configuration():
    problem = two_config_problem(jobs=4, capacity_mem=10.0)
    result = tatonnement(problem, np.zeros(NUM_RESOURCES), PlannerSettings())
    assert result.converged
    assert np.all(result.prices == 0)
    assert np.all(result.selection.choice == 0)


def test_price_rises_when_memory_is_over_demanded_and_jobs_shrink():
    problem = two_config_problem(jobs=4, capacity_mem=2.5)  # 4 big = 4.0 > 2.5; 4 small = 2.0
    result = tatonnement(problem, np.zeros(NUM_RESOURCES), PlannerSettings())
    assert result.prices[GPU_MEM] > 0
    assert result.selection.usage[GPU_MEM] <= 2.5 + 1e-9
    assert (result.selection.choice == 1).sum() >= 3  # most jobs moved to the smaller config
    assert result.converged


@pytest.mark.parametrize("schedule", list(StepSchedule))
@pytest.mark.parametrize("start", [0.0, 5.0, 50.0])
def test_prices_never_go_negative(schedule, start):
    problem = two_config_problem(jobs=3, capacity_mem=50.0)  # lots of room: prices must fall
    settings = PlannerSettings(step_schedule=schedule)
    result = tatonnement(problem, np.full(NUM_RESOURCES, start), settings)
    assert np.all(result.prices >= 0)


def test_warm_start_from_the_right_price_converges_at_once():
    problem = two_config_problem(jobs=4, capacity_mem=2.5)
    first = tatonnement(problem, np.zeros(NUM_RESOURCES), PlannerSettings())
    again = tatonnement(problem, first.prices, PlannerSettings())
    assert again.iterations <= min(3, first.iterations)
    assert np.array_equal(again.selection.choice, first.selection.choice)


def test_pending_job_waits_when_rent_exceeds_its_value():
    demand = np.zeros((NUM_RESOURCES, 1, 1))
    demand[GPU_MEM, 0, 0] = 1.0
    problem = PricingProblem(
        demand=demand,
        base=np.zeros((1, 1)),
        wait_score=np.array([1.0]),
        capacity=np.ones(NUM_RESOURCES),
        reserve=np.zeros((NUM_RESOURCES, 1)),
    )
    prices = np.zeros(NUM_RESOURCES)
    prices[GPU_MEM] = 2.0  # rent 2.0 > value 1.0
    assert not select(problem, prices).running[0]
    prices[GPU_MEM] = 0.5
    assert select(problem, prices).running[0]


def test_invalid_configurations_are_never_selected():
    problem = two_config_problem(jobs=2, capacity_mem=10.0)
    base = problem.base.copy()
    base[:, 0] = np.inf  # fast configuration below the floor / not allowed
    problem = PricingProblem(
        problem.demand, base, problem.wait_score, problem.capacity, problem.reserve
    )
    assert np.all(select(problem, np.zeros(NUM_RESOURCES)).choice == 1)
