"""HetPipe's stage cuts from measured layer costs, against a brute force over every cut."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator import metric_names as names
from hetero_operator.plan import HetPipeParams, Plan, Strategy
from hetero_operator.rebalance.promql import parse_layer_costs
from hetero_operator.rebalance.stage_cuts import LayerCostsMissing, bottleneck, recut


def brute_force_bottleneck(costs: dict[int, list[float]], ranks: Sequence[int]) -> float:
    """The smallest slowest stage over every way to cut the layers into len(ranks) non-empty stages."""
    layers = len(costs[ranks[0]])
    return min(
        bottleneck(costs, ranks, list(cuts))
        for cuts in itertools.combinations(range(1, layers), len(ranks) - 1)
    )


def pipeline_plan(virtual_workers: list[list[int]], cuts: list[list[int]], version: int = 1) -> Plan:
    world = sum(len(vw) for vw in virtual_workers)
    batches = [0] * world
    for vw in virtual_workers:
        batches[vw[0]] = 32
    return Plan(
        version=version,
        strategy=Strategy.HETPIPE,
        world_size=world,
        global_batch=sum(batches),
        local_batches=batches,
        hetpipe=HetPipeParams(
            virtual_workers=virtual_workers,
            stage_boundaries=cuts,
            microbatches_in_flight=max(len(vw) for vw in virtual_workers),
            staleness_bound=0,
        ),
    )


@settings(max_examples=60, deadline=None)
@given(
    reference=st.lists(st.floats(1e-6, 1e-3), min_size=3, max_size=8),
    speeds=st.lists(st.floats(0.1, 1.0), min_size=2, max_size=3),
)
def test_cuts_of_costs_that_differ_by_a_speed_factor_are_the_brute_force_best(
    reference: list[float], speeds: list[float]
) -> None:
    """Ranks whose costs are one device's costs over their speed: the planner's cut is the best cut."""
    if len(reference) < len(speeds):
        reference = reference * len(speeds)
    ranks = list(range(len(speeds)))
    costs = {rank: [c / speeds[rank] for c in reference] for rank in ranks}
    plan = pipeline_plan([ranks], [list(range(1, len(speeds)))])
    found = recut(plan, costs, 0.0, apply_at_epoch=2)
    best = brute_force_bottleneck(costs, ranks)
    assert found.pipelines[0].proposed_bottleneck == pytest.approx(best, rel=1e-9)


def test_a_better_cut_is_a_new_plan_at_the_next_epoch_and_the_best_cut_stays() -> None:
    # Digits-like: two heavy layers, two cheap ones and a middling one; speeds 1, 0.5, 0.25.
    reference = [40e-6, 2e-6, 40e-6, 2e-6, 8e-6]
    costs = {rank: [c / speed for c in reference] for rank, speed in enumerate([1.0, 0.5, 0.25])}
    plan = pipeline_plan([[0, 1, 2]], [[1, 2]])  # one layer per stage but the last: the placeholder
    found = recut(plan, costs, 0.05, apply_at_epoch=3)
    assert found.plan is not None
    assert found.plan.version == 2 and found.plan.apply_at_epoch == 3
    assert found.plan.local_batches == plan.local_batches  # the batch split is not the cuts' to change
    new_cuts = found.plan.hetpipe.stage_boundaries if found.plan.hetpipe else None
    # By hand: [0,1] | [2] | [3,4] costs 42, 2 x 40, 4 x 10 us; the next best, [0,1] | [2,3] | [4],
    # has a stage of 2 x 42; the placeholder's slowest is 4 x 50.
    assert new_cuts == [[2, 3]]
    assert found.pipelines[0].proposed_bottleneck == pytest.approx(80e-6)
    assert found.pipelines[0].current_bottleneck == pytest.approx(200e-6)
    assert brute_force_bottleneck(costs, [0, 1, 2]) == pytest.approx(80e-6)
    again = recut(found.plan, costs, 0.05, apply_at_epoch=5)
    assert again.plan is None and "stay" in again.reason


def test_a_gain_below_the_minimum_improvement_keeps_the_cuts() -> None:
    costs = {0: [10.0, 10.0, 10.5], 1: [10.0, 10.0, 10.5]}
    plan = pipeline_plan([[0, 1]], [[1]])  # stages 10 | 20.5; the best, [2], gives 20 | 10.5 (2.4%)
    assert recut(plan, costs, 0.05, 2).plan is None
    assert recut(plan, costs, 0.01, 2).plan is not None


def test_each_pipeline_is_cut_on_its_own_ranks_costs() -> None:
    costs = {
        0: [1.0, 1.0, 1.0, 1.0],
        1: [1.0, 1.0, 1.0, 1.0],
        2: [2.0, 2.0, 2.0, 2.0],
        3: [2.0, 2.0, 2.0, 2.0],
    }
    plan = pipeline_plan([[0], [1, 2, 3]], [[], [1, 2]])
    found = recut(plan, costs, 0.05, 2)
    assert found.plan is not None and found.plan.hetpipe is not None
    # Rank 1 is twice as fast: two layers there, one on each slower rank (2 | 2 | 2).
    assert found.plan.hetpipe.stage_boundaries == [[], [2, 3]]


def test_missing_or_inconsistent_costs_decide_nothing() -> None:
    plan = pipeline_plan([[0, 1]], [[1]])
    with pytest.raises(LayerCostsMissing, match=r"rank\(s\) \[1\]"):
        recut(plan, {0: [1.0, 1.0]}, 0.05, 2)
    with pytest.raises(LayerCostsMissing, match="layer counts"):
        recut(plan, {0: [1.0, 1.0], 1: [1.0, 1.0, 1.0]}, 0.05, 2)
    with pytest.raises(LayerCostsMissing, match="positive"):
        recut(plan, {0: [1.0, 0.0], 1: [1.0, 1.0]}, 0.05, 2)


def test_prometheus_rows_become_costs_in_layer_order() -> None:
    def row(rank: int, layer: int, value: float) -> tuple[dict[str, str], float]:
        return {names.LABEL_RANK: str(rank), names.LABEL_LAYER: str(layer)}, value

    rows = [row(0, 1, 2.0), row(0, 0, 1.0), row(1, 0, 3.0), row(1, 2, 4.0), ({"rank": "x"}, 9.0)]
    # Rank 1 misses layer 1: it is left out rather than guessed.
    assert parse_layer_costs(rows) == {0: [1.0, 2.0]}
