"""sesgd: the P2P group ring averages exactly within the planner's shuffled groups, each replica
weighted by its samples, which keeps the sample-weighted mean over all ranks."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

from hetero_operator.planner.sesgd import group_schedule

pytestmark = pytest.mark.ranks

WORLD, GROUPS, SEED, STEPS = 4, 2, 42, 5
SIZES = [5, 1, 3, 2]  # each rank's samples per step: an uneven plan


def expected_history() -> list[list[Fraction]]:
    """Exact rational simulation of the same averaging, element 0 (x_i = i): Σ b_j·x_j / Σ b_j."""
    values = [Fraction(i) for i in range(WORLD)]
    history = []
    for groups in group_schedule(WORLD, GROUPS, SEED, STEPS):
        for group in groups:
            mean = sum(SIZES[i] * values[i] for i in group) / sum(SIZES[i] for i in group)
            for i in group:
                values[i] = mean
        history.append(list(values))
    return history


@pytest.mark.timeout(120)
def test_group_ring_matches_exact_averaging_and_preserves_the_mean(tmp_path: Path) -> None:
    env = {"GROUPS": str(GROUPS), "SEED": str(SEED), "STEPS": str(STEPS), "SIZES": ",".join(map(str, SIZES))}
    results = run_ranks("sesgd_ring.py", WORLD, tmp_path, extra_env=env)
    expected = expected_history()
    for step in range(STEPS):
        got = [results[rank]["history"][step] for rank in range(WORLD)]
        assert [row[0] for row in got] == pytest.approx([float(v) for v in expected[step]], rel=1e-12)
        for column in range(5):  # every element: the sample-weighted sum over ranks never changes
            initial = [[r, r * r, -3 * r, 0.5, r / 3][column] for r in range(WORLD)]
            weighted = sum(b * v for b, v in zip(SIZES, initial, strict=True))
            got_weighted = sum(b * row[column] for b, row in zip(SIZES, got, strict=True))
            assert got_weighted == pytest.approx(weighted, abs=1e-12)
    # Groups really change between steps, so information spreads beyond one pair.
    assert len({tuple(map(tuple, g)) for g in group_schedule(WORLD, GROUPS, SEED, STEPS)}) > 1
