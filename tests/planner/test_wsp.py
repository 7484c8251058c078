"""Wave Synchronous Parallel admission gate."""

from __future__ import annotations

import pytest

from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.wsp import (
    first_gated_minibatch,
    global_staleness,
    local_staleness,
    may_start,
    required_global_clock,
)


@pytest.mark.parametrize(("nm", "d", "s_global", "first"), [(4, 0, 6, 8), (4, 1, 10, 12), (3, 2, 10, 12)])
def test_staleness_bounds(nm: int, d: int, s_global: int, first: int) -> None:
    assert global_staleness(nm, d) == s_global
    assert first_gated_minibatch(nm, d) == first
    assert local_staleness(nm) == nm - 1


def test_required_clock_sequence() -> None:
    assert [required_global_clock(p, 4, 0) for p in range(1, 17)] == [0] * 7 + [1] * 4 + [2] * 4 + [3]


def test_gate_combines_local_and_global_rules() -> None:
    # The first nm minibatches start at once.
    assert all(may_start(p, 4, 0, completed=0, global_clock=0) for p in range(1, 5))
    # Minibatch 5 needs minibatch 1 completed.
    assert not may_start(5, 4, 0, completed=0, global_clock=0)
    assert may_start(5, 4, 0, completed=1, global_clock=0)
    # Minibatch 8 additionally needs every worker's wave 0 pushed (D = 0).
    assert not may_start(8, 4, 0, completed=4, global_clock=0)
    assert may_start(8, 4, 0, completed=4, global_clock=1)
    # A looser distance bound lets the fast worker run one wave further ahead.
    assert may_start(8, 4, 1, completed=4, global_clock=0)


def simulate_missing_updates(nm: int, d: int, speeds: list[float], minibatches: int) -> int:
    """Event simulation: workers of different speeds, each minibatch taking 1/speed; returns the most
    global updates (from any worker) a starting minibatch lacks, measured in minibatches."""
    n = len(speeds)
    completed = [0] * n
    started = [0] * n
    finish: list[list[float]] = [[] for _ in range(n)]
    time = [0.0] * n
    worst = 0
    while min(completed) < minibatches:
        global_clock = min(c // nm for c in completed)
        for w in range(n):
            while started[w] < minibatches and may_start(started[w] + 1, nm, d, completed[w], global_clock):
                p = started[w] + 1
                # Global view when p starts: all waves < global_clock from every worker.
                missing = (p - 1) - global_clock * nm
                worst = max(worst, missing)
                prev_end = finish[w][-1] if finish[w] else 0.0
                finish[w].append(max(prev_end, time[w]) + 1.0 / speeds[w])
                started[w] = p
        w = min((w for w in range(n) if completed[w] < started[w]), key=lambda w: finish[w][completed[w]])
        time[w] = finish[w][completed[w]]
        completed[w] += 1
    return worst


@pytest.mark.parametrize(("nm", "d"), [(4, 0), (4, 1), (3, 2), (4, 4)])
def test_gate_reaches_but_never_exceeds_global_staleness(nm: int, d: int) -> None:
    # Workers at speeds 1 : 1.5 : 2; the bound is tight: the fast worker hits it exactly.
    assert simulate_missing_updates(nm, d, [1.0, 1.5, 2.0], 60) == global_staleness(nm, d)


def test_invalid_arguments() -> None:
    with pytest.raises(PlanningError, match="nm"):
        global_staleness(0, 0)
    with pytest.raises(PlanningError, match="minibatch"):
        required_global_clock(0, 4, 0)
