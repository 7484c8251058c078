"""The speed simulator stretches a segment to its work's calibrated base-device time ÷ speed, whatever
CPU time the segment took; overruns are counted; calibration is solo; a worker starts without scipy."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

from hetero_runtime import simulate
from hetero_runtime.simulate import SpeedSimulator, per_sample_seconds

pytestmark = pytest.mark.ranks


class VirtualClock:
    """The simulator's clock and sleep, run by the test: a segment's compute advances it by hand, a
    sleep by exactly what was asked. The arithmetic is then checked to the nanosecond, whatever the
    load of the host."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> VirtualClock:
    virtual = VirtualClock()
    monkeypatch.setattr(simulate.time, "perf_counter", virtual.perf_counter)
    monkeypatch.setattr(simulate.time, "sleep", virtual.sleep)
    return virtual


def test_a_segment_lasts_its_work_at_the_simulated_speed(clock: VirtualClock) -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    clock.now += 0.005  # the compute took 5 ms
    duration = simulator.finish(watch, 0.02)  # 20 ms of base-device work at a quarter of the speed
    assert duration == pytest.approx(0.08)
    assert simulator.overrun_seconds == 0.0 and simulator.target_seconds == pytest.approx(0.08)


def test_a_speed_file_changes_the_speed_while_the_worker_runs(
    clock: VirtualClock, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(simulate.time, "monotonic", clock.perf_counter)
    speed_file = tmp_path / "simulated-speed"
    speed_file.write_text("0.25\n")
    simulator = SpeedSimulator(0.25, speed_file)
    assert simulator.finish(simulator.begin(), 0.02) == pytest.approx(0.08)
    speed_file.write_text("0.125\n")  # the node slowed down by 2
    clock.now += simulate.SPEED_FILE_REFRESH_SECONDS
    assert simulator.finish(simulator.begin(), 0.02) == pytest.approx(0.16)
    speed_file.write_text("nonsense")  # unreadable: the last speed holds
    clock.now += simulate.SPEED_FILE_REFRESH_SECONDS
    assert simulator.finish(simulator.begin(), 0.02) == pytest.approx(0.16)


def test_extra_cpu_time_is_not_multiplied_by_the_slowdown(clock: VirtualClock) -> None:
    """The old rule (stretch CPU time ÷ speed) made 30 ms of compute last 120 ms at speed 0.25 whatever
    the work: any cold cache or busy host was multiplied by 4. The work, not the time taken, sets it."""
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    clock.now += 0.03
    assert simulator.finish(watch, 0.02) == pytest.approx(0.08)


def test_a_segment_slower_than_its_target_counts_as_overrun(clock: VirtualClock) -> None:
    simulator = SpeedSimulator(0.5)
    watch = simulator.begin()
    clock.now += 0.06  # the host held the worker up beyond the 40 ms target
    assert simulator.finish(watch, 0.02) == pytest.approx(0.06)
    assert simulator.overrun_seconds == pytest.approx(0.02)
    assert simulator.overrun_share == pytest.approx(0.5)


def test_pace_spreads_the_work_over_the_segment(clock: VirtualClock) -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    marks = []
    for part in range(1, 4):
        clock.now += 0.002  # a micro-batch of 10 ms base-device work, computed in 2 ms
        simulator.pace(watch, 0.01 * part)
        marks.append(clock.now - watch.wall)
    assert marks == pytest.approx([0.04, 0.08, 0.12])
    assert simulator.finish(watch, 0.03) == pytest.approx(0.12)
    assert simulator.overrun_seconds == pytest.approx(0.0, abs=1e-12)  # float rounding only


def test_full_speed_is_also_paced_and_no_speed_is_not(clock: VirtualClock) -> None:
    paced = SpeedSimulator(1.0)
    watch = paced.begin()
    clock.now += 0.01
    assert paced.finish(watch, 0.03) == pytest.approx(0.03)
    real = SpeedSimulator(None)
    watch = real.begin()
    clock.now += 0.01
    assert real.finish(watch, 0.5) == pytest.approx(0.01)  # a real device is never slowed down
    assert real.overrun_seconds == 0.0


def test_per_sample_cost_is_the_median_run_over_its_samples(clock: VirtualClock) -> None:
    durations = iter([0.5, 0.010, 0.030, 0.012, 0.011, 0.500])  # a warm-up, then one slow outlier

    def run() -> None:
        clock.now += next(durations)

    assert per_sample_seconds(run, samples=4, repeats=5) == pytest.approx(0.012 / 4)
    with pytest.raises(ValueError, match="at least one sample"):
        per_sample_seconds(run, samples=0)


def test_ranks_calibrate_one_at_a_time_and_share_the_slowest_figure(tmp_path: Path) -> None:
    results = run_ranks("calibrate_solo.py", 3, tmp_path)
    spans = sorted((r["started"], r["ended"], r["rank"]) for r in results)
    for (_, ended, _), (started, _, _) in itertools.pairwise(spans):
        assert started >= ended, f"two ranks calibrated at the same time: {spans}"
    measured = [r["own"] for r in results]
    for result in results:
        # Rank r's work takes (r + 1) x 4 ms per sample; everyone simulates the slowest base device.
        assert result["common"]["step"] == pytest.approx(max(measured), rel=1e-9)
    assert max(measured) >= 0.012 * 0.999  # rank 2's 12 ms per sample (a sleep never ends early)


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
