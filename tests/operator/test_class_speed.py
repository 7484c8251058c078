"""Measured speed per GPU class, aggregated over jobs: every figure below is worked out by hand from
the per-sample times the jobs recorded (speed = 1 / ms per sample)."""

from __future__ import annotations

import math

import pytest
from tests.operator.builders import profile

from hetero_operator.controller.class_speed import MeasuredSpeed, job_estimates, measured_speeds

PRIORS = {"a100": 1.0, "v100": 0.5, "t4": 0.25, "l4": 0.4}


def test_a_job_on_two_classes_rates_each_against_the_other_prior() -> None:
    # speeds 10 and 4 samples/ms: a100 = 10/4 · 0.5 = 1.25, v100 = 4/10 · 1.0 = 0.4
    estimates = job_estimates(profile({"a100": 0.1, "v100": 0.25}), PRIORS)
    assert estimates == pytest.approx({"a100": 1.25, "v100": 0.4})


def test_a_job_on_three_classes_takes_the_geometric_mean_over_the_others() -> None:
    # speeds 10, 5, 2: a100 from v100 = 10/5 · 0.5 = 1.0 and from t4 = 10/2 · 0.25 = 1.25 -> √1.25;
    # v100: 0.5 and 0.625 -> √0.3125; t4: 0.2 and 0.2 -> 0.2
    estimates = job_estimates(profile({"a100": 0.1, "v100": 0.2, "t4": 0.5}), PRIORS)
    assert estimates == pytest.approx({"a100": math.sqrt(1.25), "v100": math.sqrt(0.3125), "t4": 0.2})


def test_one_class_alone_says_nothing_and_unknown_or_unmeasured_classes_are_left_out() -> None:
    assert job_estimates(profile({"t4": 0.5}), PRIORS) == {}
    assert job_estimates(profile({"t4": 0.5, "gone": 0.1}), PRIORS) == {}  # no prior for "gone"
    assert job_estimates(profile({"t4": 0.5, "a100": 0.0}), PRIORS) == {}  # no per-sample time


def test_speeds_that_match_the_priors_measure_the_priors() -> None:
    # per-sample times in the ratio 1 : 2 : 4 are exactly the priors 1 : 0.5 : 0.25
    speeds = measured_speeds([profile({"a100": 0.2, "v100": 0.4, "t4": 0.8})], PRIORS)
    assert speeds == {
        "a100": MeasuredSpeed(1.0, 1),
        "t4": MeasuredSpeed(0.25, 1),
        "v100": MeasuredSpeed(0.5, 1),
    }


def test_the_class_speed_is_the_median_over_jobs_to_three_digits() -> None:
    jobs = [
        profile({"a100": 0.1, "v100": 0.25}),  # a100 1.25, v100 0.4
        profile({"a100": 0.1, "v100": 0.2, "t4": 0.5}),  # a100 1.1180, v100 0.5590, t4 0.2
        profile({"t4": 0.5}),  # one class: no estimate
        profile({"v100": 0.2, "t4": 1.0}),  # speeds 5, 1: v100 = 5 · 0.25 = 1.25, t4 = 1/5 · 0.5 = 0.1
    ]
    assert measured_speeds(jobs, PRIORS) == {
        "a100": MeasuredSpeed(1.18, 2),  # (1.25 + 1.1180) / 2 = 1.1840
        "t4": MeasuredSpeed(0.15, 2),  # (0.2 + 0.1) / 2
        "v100": MeasuredSpeed(0.559, 3),  # median of 0.4, 0.5590, 1.25
    }
