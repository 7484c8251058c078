"""Predicting the balanced phase from the even phase alone, on a synthetic run worked out by hand."""

from __future__ import annotations

import pytest

from hetero_operator.simulator.balance_prediction import MeasuredPhase, predict_balanced

# Even split 40/40/40: compute 40, 80, 160 ms, so 1, 2 and 4 ms per sample. The slowest worker waited
# least, so its 5 ms of comm is the all-reduce alone.
EVEN = MeasuredPhase((40, 40, 40), (40.0, 80.0, 160.0), comm_ms=(125.0, 85.0, 5.0), samples_per_s=700.0)
BALANCED = MeasuredPhase((68, 35, 17), (68.0, 70.0, 68.0), comm_ms=(7.0, 5.0, 7.0), samples_per_s=1500.0)


def test_the_balanced_split_and_its_speed_follow_from_the_even_phase_alone() -> None:
    prediction = predict_balanced(EVEN, BALANCED)
    # 120 in the ratio 1 : 1/2 : 1/4 is 68.6 / 34.3 / 17.1; floored 68 / 34 / 17, the last sample goes
    # to the worker that is then ready first (69 ms against 70 and 72)
    assert prediction.predicted_split == (69, 34, 17)
    # max(69·1, 34·2, 17·4) + 5 = 74 ms per step of 120 samples
    assert prediction.predicted_samples_per_s == pytest.approx(120_000 / 74)
    # the split that ran: max(68, 70, 68) + 5 = 75 ms
    assert prediction.predicted_at_run_split_samples_per_s == pytest.approx(1600.0)
    assert prediction.error_at_run_split == pytest.approx(1600 / 1500 - 1)
    assert prediction.error == pytest.approx(120_000 / 74 / 1500 - 1)
    assert prediction.split_difference == pytest.approx(1 / 120)
    # the even phase itself: 160 + 5 = 165 ms
    assert prediction.even_error == pytest.approx(120_000 / 165 / 700 - 1)


def test_an_error_far_off_is_reported_not_hidden() -> None:
    slower = MeasuredPhase(BALANCED.local_batches, BALANCED.compute_ms, BALANCED.comm_ms, samples_per_s=800.0)
    assert predict_balanced(EVEN, slower).error_at_run_split == pytest.approx(1.0)  # 1600 against 800


def test_phases_of_different_runs_are_refused() -> None:
    other = MeasuredPhase((60, 60), (1.0, 1.0), (1.0, 1.0), 1.0)
    with pytest.raises(ValueError, match="same workers"):
        predict_balanced(EVEN, other)
    with pytest.raises(ValueError, match="worker_comm_ms"):
        MeasuredPhase.from_artifact({"local_batches": [1], "worker_compute_ms": [1.0], "samples_per_s": 1.0})
