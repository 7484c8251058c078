"""Uneven sampler: every sample of an epoch is used exactly once, split by the plan, resumable."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler, epoch_order, split_tail

plans = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=6).filter(any)


def epoch_indices(size: int, batches: list[int], position: SamplerPosition) -> list[list[np.ndarray]]:
    per_rank = [
        list(UnevenBatchSampler(size, rank, seed=7).epoch(position, batches)) for rank in range(len(batches))
    ]
    return [[step.indices for step in steps] for steps in per_rank]


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=300), plans)
def test_epoch_covers_every_sample_once_without_overlap(size: int, batches: list[int]) -> None:
    per_rank = epoch_indices(size, batches, SamplerPosition(0, 0))
    used = np.concatenate([idx for steps in per_rank for idx in steps] or [np.array([], dtype=int)])
    assert sorted(used.tolist()) == list(range(size))
    full_steps = size // sum(batches)
    for rank, steps in enumerate(per_rank):
        assert all(len(idx) == batches[rank] for idx in steps[:full_steps])


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=200), plans, plans, st.data())
def test_resuming_under_a_new_split_continues_where_it_stopped(
    size: int, before: list[int], after: list[int], data: st.DataObject
) -> None:
    """Stop mid-epoch under one plan, resume under another (even another world size): no loss, no repeat."""
    steps = list(UnevenBatchSampler(size, 0, seed=7).epoch(SamplerPosition(3, 0), before))
    cut = data.draw(st.integers(min_value=0, max_value=len(steps)))
    position = steps[cut - 1].position_after if cut else SamplerPosition(3, 0)
    first = epoch_indices(size, before, SamplerPosition(3, 0))
    seen = [idx for steps_of_rank in first for idx in steps_of_rank[:cut]]
    rest = epoch_indices(size, after, position)
    used = np.concatenate([*seen, *[idx for s in rest for idx in s]] or [np.array([], dtype=int)])
    assert sorted(used.tolist()) == list(range(size))


def test_order_depends_on_seed_and_epoch_only() -> None:
    assert np.array_equal(epoch_order(50, 1, 2), epoch_order(50, 1, 2))
    assert not np.array_equal(epoch_order(50, 1, 2), epoch_order(50, 1, 3))


@settings(max_examples=100, deadline=None)
@given(plans, st.integers(min_value=1, max_value=500))
def test_tail_split_keeps_proportions_and_total(batches: list[int], tail: int) -> None:
    sizes = split_tail(batches, tail)
    assert sum(sizes) == tail
    total = sum(batches)
    assert all(abs(s - b * tail / total) < 1 for s, b in zip(sizes, batches, strict=True))
