"""When a Workload waiting for admission looks again for another mix (pure)."""

from __future__ import annotations

import pytest

from hetero_operator.controller.kueue_step import reproposal_due

EVERY = 60.0


@pytest.mark.parametrize(
    ("last", "now", "due"),
    [
        (None, 59.0, False),  # not waited long enough
        (50.0, 61.0, True),  # the first cycle past a minute of waiting
        (61.0, 70.0, False),  # looked already in this round
        (100.0, 121.0, True),  # the next round
        (None, 75.0, True),  # just restarted, a round has passed: look once
    ],
)
def test_a_waiting_workload_looks_for_another_mix_once_per_round(
    last: float | None, now: float, due: bool
) -> None:
    looked, wake = reproposal_due(0.0, EVERY, last, now)
    assert looked is due
    assert wake == pytest.approx(EVERY * (now // EVERY + 1) - now)
