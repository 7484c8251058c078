"""DreamDDP schedule: checked examples and brute force over contiguous partitions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.planner.dreamddp import exposed_ms, phase_of_step, schedule
from hetero_operator.planner.errors import PlanningError

# (H, forward, backward, comm, phases, extra, iteration_ms, period, exposed)
EXAMPLES = [
    (3, 0.0, [1] * 6, [2] * 6, [[0, 1, 2], [3], [4, 5]], [[], [0], [0, 1]], [7, 6, 9], 22, 4),
    (
        3,
        2.0,
        [3, 1, 4, 2, 2, 3],
        [2, 4, 6, 3, 4, 3],
        [[0, 1, 2], [3], [4, 5]],
        [[], [0, 1], [0, 1]],
        [17, 17, 21],
        55,
        4,
    ),
    (
        3,
        0.0,
        [2] * 6,
        [1] * 6,
        [[0, 1, 2, 3, 4, 5], [], []],
        [[], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4]],
        [13, 12, 12],
        37,
        1,
    ),
    (2, 0.0, [1, 1, 6, 1], [1, 1, 1, 4], [[0, 1, 2, 3], []], [[], [0, 1, 2]], [13, 9], 22, 4),
]


@pytest.mark.parametrize(("h", "fp", "bp", "comm", "phases", "extra", "iters", "period", "exposed"), EXAMPLES)
def test_checked_examples(
    h: int,
    fp: float,
    bp: list[float],
    comm: list[float],
    phases: list[list[int]],
    extra: list[list[int]],
    iters: list[float],
    period: float,
    exposed: float,
) -> None:
    s = schedule(h, fp, bp, comm)
    assert [list(p) for p in s.phases] == phases
    assert [list(e) for e in s.extra] == extra
    assert list(s.iteration_ms) == pytest.approx(iters)
    assert s.period_ms == pytest.approx(period)
    assert s.exposed_ms == pytest.approx(exposed)


def test_every_layer_synced_at_most_every_h_steps() -> None:
    s = schedule(3, 2.0, [3, 1, 4, 2, 2, 3], [2, 4, 6, 3, 4, 3])
    assert s.phases_of_layer() == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0], 3: [1], 4: [2], 5: [2]}
    assert [phase_of_step(t, 3) for t in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def brute_force(h: int, bp: list[float], comm: list[float]) -> float:
    n = len(bp)
    best = float("inf")
    for blocks in range(1, min(h, n) + 1):
        for cuts in itertools.combinations(range(1, n), blocks - 1):
            bounds = [0, *cuts, n]
            total = sum(exposed_ms(range(bounds[i], bounds[i + 1]), bp, comm) for i in range(blocks))
            best = min(best, total)
    return best


times = st.integers(0, 8).map(float)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 5).flatmap(
        lambda h: st.tuples(st.just(h), st.lists(st.tuples(times, times), min_size=1, max_size=10))
    ),
    times,
)
def test_partition_matches_brute_force(case: tuple[int, list[tuple[float, float]]], fp: float) -> None:
    h, layers = case
    bp = [b for b, _ in layers]
    comm = [c for _, c in layers]
    s = schedule(h, fp, bp, comm)
    assert s.exposed_ms == pytest.approx(brute_force(h, bp, comm))
    assert len(s.phases) == h
    assert [i for p in s.phases for i in p] == list(range(len(bp)))  # contiguous, in order, each once
    # Filling is free: a phase's time is exactly that of its own block.
    for p, it in zip(s.phases, s.iteration_ms, strict=True):
        assert it == pytest.approx(fp + sum(bp) + exposed_ms(p, bp, comm))
    for h_idx, fill in enumerate(s.extra):
        first = s.phases[h_idx][0] if s.phases[h_idx] else len(bp)
        assert all(b < first for b in fill)
    assert s.extra[0] == ()


def test_invalid_input() -> None:
    with pytest.raises(PlanningError, match="comm_ms"):
        schedule(2, 0.0, [1.0, 2.0], [1.0])
    with pytest.raises(PlanningError, match="H"):
        schedule(0, 0.0, [1.0], [1.0])
