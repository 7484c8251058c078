"""The demo's report against its control run, from hand-made epochs."""

from __future__ import annotations

import pytest

from hetero_operator.demo.report import (
    EpochRow,
    baseline_comparison,
    control_comparison,
    epoch_rows,
    rank_speeds,
)


def row(epoch: int, samples_per_second: float) -> EpochRow:
    return EpochRow(epoch, 1, [1, 1, 1], samples_per_second, 1.0, None)


def test_speed_up_over_the_control_and_the_ideal_of_the_measured_speeds() -> None:
    control = [row(1, 800.0), row(2, 1000.0), row(3, 1000.0), row(4, 1100.0)]  # steady: median of last 3
    job = [row(1, 900.0), row(2, 1500.0), row(3, 2000.0), row(4, 2100.0), row(5, 2200.0)]
    # The control paced to a base device 10% slower than the job's: its speeds 360 : 180 : 90.
    compared = control_comparison(job, control, [360.0, 180.0, 90.0], [400.0, 200.0, 100.0])
    assert compared["raw_steady_samples_per_second"] == 1000.0
    assert compared["steady_samples_per_second"] == pytest.approx(1000.0 * 700 / 630, rel=1e-4)
    job = [row(r.epoch, r.samples_per_second * 700 / 630) for r in job]
    compared = control_comparison(job, control, [360.0, 180.0, 90.0], [400.0, 200.0, 100.0])
    assert compared["ideal_speedup"] == pytest.approx(630.0 / 270.0)  # sum(v) / (n * min v)
    assert compared["speedup"] == pytest.approx(2.1)  # median of 2.0, 2.1, 2.2
    assert compared["of_ideal"] == pytest.approx(2.1 / (7 / 3), rel=1e-4)
    assert compared["speedup_per_epoch"][2] == pytest.approx(2.0)
    assert compared["of_ideal_per_epoch"][2] == pytest.approx(2.0 / (7 / 3), rel=1e-4)


def test_without_a_control_nothing_is_claimed() -> None:
    compared = control_comparison([row(1, 900.0)], [], [], [])
    assert compared["speedup"] is None and compared["ideal_speedup"] is None and compared["of_ideal"] is None


def test_rank_speeds_need_every_rank_and_keep_each_in_its_place() -> None:
    # Rank 1 not scraped yet: no list, rather than rank 2's speed standing in rank 1's place.
    assert rank_speeds([400, 200, 100], {0: 1.0, 2: 1.0}) is None
    assert rank_speeds([400, 200, 100], {0: 1.0, 1: 0.0, 2: 1.0}) is None
    assert rank_speeds([], {}) is None
    assert rank_speeds([400, 200, 100], {0: 0.5, 1: 1.0, 2: 2.0}) == [800.0, 200.0, 50.0]


def test_the_ideal_over_each_baseline_is_what_the_measured_speeds_allow_over_its_split() -> None:
    # Worked by hand, speeds 400 : 200 : 60 samples/s (sum 660): every worker busy takes 1/660 s a
    # sample. The fastest alone takes 1/400 (ideal 1.65x); the priors' 4 : 2 : 1 waits for the slow
    # worker's 1/7 at 60 (1/420, ideal 1.571x); the even split for a third at 60 (1/180, ideal 3.667x).
    own = {"fast": 400.0, "medium": 200.0, "slow": 60.0}
    control = [row(1, 300.0), row(2, 400.0), row(3, 400.0), row(4, 400.0)]
    job = [row(1, 420.0), row(2, 600.0), row(3, 600.0), row(4, 600.0)]
    cases = {
        "fastest": ({"fast": 1.0}, 660 / 400),
        "prior": ({"fast": 4 / 7, "medium": 2 / 7, "slow": 1 / 7}, 660 / 420),
        "even": (dict.fromkeys(own, 1 / 3), 660 / 180),
    }
    for name, (shares, ideal) in cases.items():
        measured = {node: own[node] for node in shares}  # the baseline paced to the same base
        compared = baseline_comparison(job, control, measured, own, shares)
        assert compared["ideal_speedup"] == pytest.approx(ideal), name
        assert compared["base_ratio"] == pytest.approx(1.0)
        assert compared["speedup"] == pytest.approx(1.5), name  # 600 over the baseline's steady 400
        assert compared["of_ideal"] == pytest.approx(1.5 / ideal), name


def test_a_baseline_on_a_node_the_job_never_measured_claims_no_ideal() -> None:
    compared = baseline_comparison(
        [row(1, 600.0)], [row(1, 400.0)], {"gone": 100.0}, {"fast": 400.0}, {"gone": 1.0}
    )
    assert (
        compared["ideal_speedup"] is None and compared["of_ideal"] is None and compared["base_ratio"] is None
    )


def test_an_epochs_samples_are_what_it_covered_not_its_steps_times_the_global_batch() -> None:
    # 1437 samples in steps of 64: 22 full steps and one of 29. Rank 0's line carries the epoch's
    # coverage; a script's own loop's line does not, and falls back to its steps x the global batch.
    runtime = {"epoch": 1, "plan_version": 1, "steps": 23, "wall_seconds": 2.0, "global_samples": 1437}
    own_loop = {"epoch": 2, "plan_version": 1, "steps": 23, "wall_seconds": 2.0}
    rows = epoch_rows([runtime, own_loop], {1: [37, 18, 9]})
    assert rows[0].samples_per_second == pytest.approx(1437 / 2.0)
    assert rows[1].samples_per_second == pytest.approx(23 * 64 / 2.0)
