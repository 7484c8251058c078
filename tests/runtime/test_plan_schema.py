"""The shared Plan schema: valid plans round-trip, invalid ones name the field and the fix."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from hetero_operator.plan import HetPipeParams, Plan, SESGDParams, Strategy, even_local_batches


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=16).filter(any))
def test_valid_plans_round_trip_through_json(batches: list[int]) -> None:
    plan = Plan(version=3, world_size=len(batches), global_batch=sum(batches), local_batches=batches)
    assert Plan.from_json(plan.to_json()) == plan


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"local_batches": [10, 10]}, "world_size is 3"),
        ({"local_batches": [10, 10, 11]}, "make them add up"),
        ({"local_batches": [0, 0, 0], "global_batch": 1}, "sum to 0"),
        ({"strategy": "sesgd"}, "needs its parameters under 'sesgd'"),
        ({"strategy": "sesgd", "sesgd": {"groups": 2}}, "does not divide world_size 3"),
        ({"version": -1}, "version"),
        ({"strategy": "warp"}, "strategy"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_invalid_plans_are_refused_with_the_field_named(fields: dict, message: str) -> None:
    base = {"version": 1, "world_size": 3, "global_batch": 30, "local_batches": [10, 10, 10]}
    with pytest.raises(ValidationError, match=message):
        Plan.model_validate(base | fields)


def test_hetpipe_plan_must_cover_every_rank_once() -> None:
    hetpipe = HetPipeParams(virtual_workers=[[0, 1], [2]], stage_boundaries=[[2], []])
    Plan(
        version=1,
        strategy=Strategy.HETPIPE,
        world_size=3,
        global_batch=8,
        local_batches=[8, 0, 0],
        hetpipe=hetpipe,
    )
    with pytest.raises(ValidationError, match="every rank"):
        Plan(
            version=1,
            strategy=Strategy.HETPIPE,
            world_size=4,
            global_batch=8,
            local_batches=[8, 0, 0, 0],
            hetpipe=hetpipe,
        )
    with pytest.raises(ValidationError, match="cut points"):
        HetPipeParams(virtual_workers=[[0, 1]], stage_boundaries=[[]])


def test_fits_world_explains_a_mismatch() -> None:
    plan = Plan(version=1, world_size=2, global_batch=4, local_batches=[2, 2], sesgd=SESGDParams(groups=1))
    assert plan.fits_world(2) is None
    assert "3 ranks" in (plan.fits_world(3) or "")


@settings(max_examples=50, deadline=None)
@given(st.integers(min_value=0, max_value=10_000), st.integers(min_value=1, max_value=64))
def test_even_split_is_even_and_complete(total: int, world: int) -> None:
    split = even_local_batches(total, world)
    assert sum(split) == total and len(split) == world
    assert max(split) - min(split) <= 1
