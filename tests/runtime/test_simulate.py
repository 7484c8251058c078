"""The speed simulator stretches a segment to its work's calibrated base-device time ÷ speed, whatever
CPU time the segment took; overruns are counted; calibration is solo; a worker starts without scipy."""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

from hetero_runtime.simulate import SpeedSimulator, per_sample_seconds


def burn_cpu(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_segment_lasts_its_work_at_the_simulated_speed() -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    burn_cpu(0.005)
    duration = simulator.finish(watch, 0.02)  # 20 ms of base-device work at a quarter of the speed
    assert duration == pytest.approx(0.08, abs=0.01)
    assert simulator.overrun_seconds == 0.0


def test_extra_cpu_time_is_not_multiplied_by_the_slowdown() -> None:
    """The old rule (stretch CPU time ÷ speed) made 30 ms of CPU last 120 ms at speed 0.25 whatever the
    work: any cold cache or busy host was multiplied by 4. The work, not the CPU time, sets the target."""
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    burn_cpu(0.03)
    assert simulator.finish(watch, 0.02) == pytest.approx(0.08, abs=0.01)


def test_a_segment_slower_than_its_target_counts_as_overrun() -> None:
    simulator = SpeedSimulator(0.5)
    watch = simulator.begin()
    time.sleep(0.06)  # the host held the worker up beyond the 40 ms target
    duration = simulator.finish(watch, 0.02)
    assert duration == pytest.approx(0.06, abs=0.01)
    assert simulator.overrun_seconds == pytest.approx(0.02, abs=0.01)
    assert simulator.overrun_share == pytest.approx(0.5, abs=0.25)


def test_pace_spreads_the_work_over_the_segment() -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    marks = []
    for part in range(1, 4):
        simulator.pace(watch, 0.01 * part)  # after each micro-batch of 10 ms base-device work
        marks.append(time.perf_counter() - watch.wall)
    duration = simulator.finish(watch, 0.03)
    for part, mark in enumerate(marks, start=1):
        assert mark == pytest.approx(0.04 * part, abs=0.012)
    assert duration == pytest.approx(0.12, abs=0.012)
    assert simulator.overrun_seconds < 0.002  # only the sleep's timer slack


def test_full_speed_is_also_paced_and_no_speed_is_not() -> None:
    paced = SpeedSimulator(1.0)
    watch = paced.begin()
    assert paced.finish(watch, 0.03) == pytest.approx(0.03, abs=0.01)
    real = SpeedSimulator(None)
    watch = real.begin()
    assert real.finish(watch, 0.5) < 0.01  # a real device is never slowed down


def test_per_sample_cost_is_the_median_run_over_its_samples() -> None:
    durations = iter([0.5, 0.010, 0.030, 0.012, 0.011, 0.500])  # a warm-up, then one slow outlier

    def run() -> None:
        time.sleep(next(durations))

    cost = per_sample_seconds(run, samples=4, repeats=5)
    assert cost == pytest.approx(0.012 / 4, rel=0.3)


def test_ranks_calibrate_one_at_a_time_and_share_the_slowest_figure(tmp_path: Path) -> None:
    results = run_ranks("calibrate_solo.py", 3, tmp_path)
    spans = sorted((r["started"], r["ended"], r["rank"]) for r in results)
    for (_, ended, _), (started, _, _) in itertools.pairwise(spans):
        assert started >= ended, f"two ranks calibrated at the same time: {spans}"
    measured = [r["own"] for r in results]
    for result in results:
        # Rank r's work takes (r + 1) x 4 ms per sample; everyone simulates the slowest base device.
        assert result["common"]["step"] == pytest.approx(max(measured), rel=1e-9)
    assert max(measured) == pytest.approx(0.012, rel=0.5)


def test_worker_start_does_not_import_scipy() -> None:
    """Workers import the planner; scipy.stats costs most of a second to import and only robust fits
    over three or more batch sizes need it."""
    probe = (
        "import sys\n"
        "import hetero_operator.planner, hetero_operator.planner.fitting, hetero_operator.rebalance.decide\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'scipy'))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
