"""How the closed loop's slowdown run is read: the ideal for the new speeds and the epochs back."""

from __future__ import annotations

import pytest

from hetero_operator.demo.slowdown import (
    first_epoch_of,
    metrics_delay_epochs,
    recovery,
    slowdown_factor,
    slowed_rank,
)


def _report(speedups: list[float | None], seconds: float = 3.0) -> dict:
    rows = [
        {"epoch": e, "plan_version": 2 if e < 7 else 3, "wall_seconds": seconds}
        for e in range(1, len(speedups) + 1)
    ]
    control = {
        "measured_speeds": [400.0, 200.0, 100.0],
        "own_speeds": [392.0, 196.0, 98.0],  # the job's own run paces to a base 2% slower
        "speedup_per_epoch": speedups,
    }
    return {"per_epoch": rows, "control": control}


SEEN = {"factor": 2.0, "slowed_in": 5, "slowed": {"toVersion": 3}}
HALVED = [196.0, 196.0, 98.0]  # the job's speeds under the plan that answered: rank 0 at half


def test_the_new_ideal_divides_the_slowed_ranks_speed_and_keeps_the_controls_pace() -> None:
    # New speeds 200, 200, 100: the ideal over the even split is 500 / (3 * 100).
    found = recovery(_report([1.0, 2.2, 2.2, 2.2, 1.8, 1.3, 1.6, 1.6]), SEEN, 0, 0.9, HALVED)
    assert found["measured_factor"] == pytest.approx(2.0)
    ideal = 500 / 300
    assert found["new_ideal_speedup"] == pytest.approx(ideal)
    assert [e["epoch"] for e in found["epochs"]] == [5, 6, 7, 8]
    shares = [e["of_new_ideal"] for e in found["epochs"]]
    assert shares == pytest.approx([1.8 / ideal, 1.3 / ideal, 0.96, 0.96])
    # Epoch 5 itself does not count (it began before the slowdown): back at 7, two epochs on.
    assert (found["back_at_epoch"], found["epochs_to_back"], found["new_split_from_epoch"]) == (7, 2, 7)


def test_no_recovery_is_claimed_when_the_slowed_rank_became_the_slowest_or_never_came_back() -> None:
    assert recovery(_report([2.0] * 8), SEEN, 0, 0.9, [49.0, 196.0, 98.0]) == {}  # 8x: now the slowest
    assert recovery(_report([2.0] * 8), SEEN, 0, 0.9, []) == {}  # nothing measured after it
    never = recovery(_report([2.2] * 4 + [1.2] * 4), SEEN, 0, 0.9, HALVED)
    assert never["back_at_epoch"] is None and never["epochs_to_back"] is None


def test_epochs_of_a_plan_and_the_metrics_delay_in_epochs() -> None:
    rows = _report([1.0] * 8, seconds=3.0)["per_epoch"]
    assert first_epoch_of(rows, 3) == 7
    assert first_epoch_of(rows, 4) is None
    assert metrics_delay_epochs(rows, 5, 7) == 3  # 8 s over 3-second epochs
    assert metrics_delay_epochs(rows, 5, 6) == 0  # no slowed epoch between
    status = {"allocation": {"workers": [{"rank": 0, "node": "a"}, {"rank": 1, "node": "b"}]}}
    assert (slowed_rank(status, "b"), slowed_rank(status, "c")) == (1, None)


def test_the_slowdown_is_measured_against_the_other_ranks_of_the_same_runs() -> None:
    # Rank 0 at 1.9x slower, in a run whose base is 5% faster than before: the base cancels.
    before, after = [400.0, 200.0, 100.0], [420.0 / 1.9, 210.0, 105.0]
    assert slowdown_factor(before, after, 0) == pytest.approx(1.9)
    assert slowdown_factor(before, after[:2], 0) is None
    assert slowdown_factor(before, [0.0, 210.0, 105.0], 0) is None
