"""sesgd: the P2P group ring averages exactly within the planner's shuffled groups."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

from hetero_operator.planner.sesgd import group_schedule

WORLD, GROUPS, SEED, STEPS = 4, 2, 42, 5


def expected_history() -> list[list[Fraction]]:
    """Exact rational simulation of the same averaging, element 0 (x_i = i)."""
    values = [Fraction(i) for i in range(WORLD)]
    history = []
    for groups in group_schedule(WORLD, GROUPS, SEED, STEPS):
        for group in groups:
            mean = sum(values[i] for i in group) / len(group)
            for i in group:
                values[i] = mean
        history.append(list(values))
    return history


@pytest.mark.timeout(120)
def test_group_ring_matches_exact_averaging_and_preserves_the_mean(tmp_path: Path) -> None:
    env = {"GROUPS": str(GROUPS), "SEED": str(SEED), "STEPS": str(STEPS)}
    results = run_ranks("sesgd_ring.py", WORLD, tmp_path, extra_env=env)
    expected = expected_history()
    for step in range(STEPS):
        got = [results[rank]["history"][step] for rank in range(WORLD)]
        assert [row[0] for row in got] == [float(v) for v in expected[step]]
        for column in range(5):  # every element: the sum over ranks never changes
            initial = [[r, r * r, -3 * r, 0.5, r / 3][column] for r in range(WORLD)]
            assert sum(row[column] for row in got) == pytest.approx(sum(initial), abs=1e-12)
    # Groups really change between steps, so information spreads beyond one pair.
    assert len({tuple(map(tuple, g)) for g in group_schedule(WORLD, GROUPS, SEED, STEPS)}) > 1
