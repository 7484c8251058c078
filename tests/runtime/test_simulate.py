"""The speed simulator stretches the compute thread's own CPU time, and a worker starts without scipy."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import threading
import time

import pytest

from hetero_runtime.simulate import SpeedSimulator


def burn_without_gil(stop: threading.Event) -> None:
    """CPU work on another thread: hashing a large buffer releases the GIL, like torch's kernels."""
    block = bytes(4 << 20)
    while not stop.is_set():
        hashlib.sha256(block).digest()


def test_cpu_of_other_threads_is_not_stretched() -> None:
    simulator = SpeedSimulator(0.05)
    stop = threading.Event()
    burner = threading.Thread(target=burn_without_gil, args=(stop,), daemon=True)
    burner.start()
    try:
        time.sleep(0.05)  # the burner is running before the segment starts
        cpu_before = time.process_time()
        watch = simulator.begin()
        time.sleep(0.2)  # the compute thread waits; only the other thread uses CPU
        duration = simulator.finish(watch)
        process_cpu = time.process_time() - cpu_before
    finally:
        stop.set()
        burner.join()
    # The process did use CPU meanwhile (stretched, >= 0.02 s / 0.05 would have lasted >= 0.4 s) ...
    assert process_cpu >= 0.02, f"the burner thread got too little CPU ({process_cpu:.3f} s) to tell"
    # ... but none of it was the compute thread's, so nothing was stretched.
    assert duration == pytest.approx(0.2, abs=0.12)


def test_finish_reports_the_stretched_duration_it_slept_to() -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    end = time.thread_time() + 0.02
    while time.thread_time() < end:
        pass
    duration = simulator.finish(watch)
    assert duration >= 0.08
    assert time.perf_counter() - watch.wall == pytest.approx(duration, abs=0.005)


def test_waiting_beyond_the_stretched_time_is_counted_as_overrun() -> None:
    simulator = SpeedSimulator(0.5)
    watch = simulator.begin()
    time.sleep(0.05)  # e.g. descheduled by a busy host: no CPU used, nothing to stretch
    simulator.finish(watch)
    assert simulator.overrun_seconds == pytest.approx(0.05, abs=0.02)
    slow = SpeedSimulator(0.05)
    watch = slow.begin()
    end = time.thread_time() + 0.01
    while time.thread_time() < end:
        pass
    slow.finish(watch)  # 10 ms of CPU is stretched to 200 ms: the wait was absorbed by sleeping
    assert slow.overrun_seconds == 0.0


def test_pace_stretches_each_part_of_a_segment_as_it_ends() -> None:
    simulator = SpeedSimulator(0.25)
    watch = simulator.begin()
    marks = []
    for _ in range(3):
        end = time.thread_time() + 0.01
        while time.thread_time() < end:
            pass
        simulator.pace(watch)  # 10 ms more CPU: the segment so far lasts 4x its CPU time
        marks.append(time.perf_counter() - watch.wall)
    duration = simulator.finish(watch)  # nothing left to stretch
    for part, mark in enumerate(marks, start=1):
        assert mark == pytest.approx(0.04 * part, abs=0.015)
    assert duration == pytest.approx(marks[-1], abs=0.01)
    # The last pace slept to the segment's target, and a sleep ends up to the kernel's timer slack
    # (50 us by default) late: finish counts that, and only that, as overrun.
    assert simulator.overrun_seconds < 0.001


def test_finish_on_another_thread_is_refused() -> None:
    simulator = SpeedSimulator(0.5)
    watch = simulator.begin()
    errors: list[BaseException] = []

    def finish_elsewhere() -> None:
        try:
            simulator.finish(watch)
        except RuntimeError as err:
            errors.append(err)

    other = threading.Thread(target=finish_elsewhere)
    other.start()
    other.join()
    assert len(errors) == 1 and "thread that called begin" in str(errors[0])


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
