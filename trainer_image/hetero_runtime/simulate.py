"""Simulated GPU speed for workers that stand in for GPUs on one machine (local process nodes,
benchmarks): a worker at speed s takes 1/s times as long as the fastest device for the same work.

The length of that work at full speed is calibrated once, solo, when the job starts: each rank in turn
times its compute per sample while the others wait (`calibrate_solo`), and every rank then takes the
slowest rank's figure, so all of them simulate the same base device. A compute segment is then
stretched, by sleeping, to (its samples × that per-sample cost) ÷ s. It is not stretched to its own
CPU time ÷ s: extra CPU time from cold caches or a busy host would be multiplied by 1/s, and the
simulated speeds would drift from the claimed ones without anything noticing. A script's own loop
(the wrapper's), which the runtime cannot calibrate ahead, is paced the same way, to its samples times
the slowest rank's median time per sample over its recent steps (`RecentPace`).

A segment that the host made slower than its target overruns it; the overrun is counted, so a run
can tell (and report) that the speeds it claims were not met.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

CALIBRATION_REPEATS = 5


def read_speed(path: Path, current: float) -> float:
    """The speed a speed file holds, in (0, 1]; `current` while the file is missing or unreadable."""
    try:
        value = float(path.read_text().strip())
    except (OSError, ValueError):
        return current
    if not 0 < value <= 1:
        return current
    if value != current:
        log.warning("SIMULATION: simulated speed now %.3g (was %.3g)", value, current)
    return value


def stretched_seconds(full_speed_seconds: float, speed: float) -> float:
    """How long work that lasts `full_speed_seconds` on the base device takes at `speed`."""
    return full_speed_seconds / speed


@dataclass(frozen=True)
class Stopwatch:
    wall: float


# How often a speed file is looked at again.
SPEED_FILE_REFRESH_SECONDS = 0.5


class SpeedSimulator:
    def __init__(self, speed: float | None, speed_file: Path | None = None) -> None:
        self._speed = 1.0 if speed is None else speed
        # With a speed set (1 included) every segment is paced to the calibrated base device, so the
        # fastest simulated GPU is the same device for every rank and never faster than calibrated.
        self.active = speed is not None
        self.overrun_seconds = 0.0  # wall time beyond the targets, summed: speed not met
        self.target_seconds = 0.0  # the targets, summed
        # A GPU that slows down while it runs (a noisy neighbour): its current speed is in this file.
        self.speed_file = speed_file if self.active else None
        self._read_at = -SPEED_FILE_REFRESH_SECONDS

    @property
    def speed(self) -> float:
        if self.speed_file is not None and time.monotonic() - self._read_at >= SPEED_FILE_REFRESH_SECONDS:
            self._read_at = time.monotonic()
            self._speed = read_speed(self.speed_file, self._speed)
        return self._speed

    def announce(self, rank: int) -> None:
        if self.active:
            log.warning(
                "SIMULATION: rank %d runs at simulated speed %.3g: every compute segment is stretched to "
                "%.3gx the base device's calibrated time for its samples, by sleeping",
                rank,
                self.speed,
                1.0 / self.speed,
            )

    def begin(self) -> Stopwatch:
        return Stopwatch(time.perf_counter())

    def pace(self, watch: Stopwatch, full_speed_seconds: float) -> None:
        """Inside a segment (after one of its micro-batches, say): sleep until the segment so far
        lasts the simulated time of the work done so far. A slow GPU works at its pace all through a
        step; stretching only at the end would run every worker's compute in one burst at the start
        of the step, where the bursts of workers sharing a host's cores collide."""
        if self.active:
            self._stretch(watch, full_speed_seconds, count=False)

    def finish(self, watch: Stopwatch, full_speed_seconds: float) -> float:
        """End a segment whose work lasts `full_speed_seconds` on the base device: sleep until it
        lasts that ÷ speed; returns the segment's duration as measured after the sleep."""
        if self.active:
            self._stretch(watch, full_speed_seconds, count=True)
        return time.perf_counter() - watch.wall

    def _stretch(self, watch: Stopwatch, full_speed_seconds: float, count: bool) -> None:
        target = stretched_seconds(full_speed_seconds, self.speed)
        wall = time.perf_counter() - watch.wall
        if target > wall:
            time.sleep(target - wall)
        if count:
            self.target_seconds += target
            self.overrun_seconds += max(0.0, wall - target)

    @property
    def overrun_share(self) -> float:
        """Overrun as a share of the simulated compute time so far (0 = the speed held exactly)."""
        return self.overrun_seconds / self.target_seconds if self.target_seconds > 0 else 0.0


def per_sample_seconds(run: Callable[[], None], samples: int, repeats: int = CALIBRATION_REPEATS) -> float:
    """Median wall time per sample of `run` (which computes on `samples` samples), after one warm-up."""
    if samples < 1:
        raise ValueError("calibration needs at least one sample")
    run()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / samples


RECENT_STEPS = 50


@dataclass
class RecentPace:
    """The base device for a loop the runtime does not own (a script's, through the wrapper), which it
    cannot calibrate ahead: the median compute time per sample of this rank's recent steps, its pace
    for the work; where the ranks share their paces at every step (the `data` strategy's all-reduce
    carries them), the slowest rank's, so that every rank simulates the same base device, as the
    runtime's own loop takes the slowest rank's calibrated figure. A step's work at full speed is its
    samples times that; a simulated slower device is paced to it over its speed, not to each step's
    own time over it, which would multiply the host's noise by 1/speed (four times on a rank at
    0.25), and a lasting change of the host's pace reaches it within the window."""

    window: int = RECENT_STEPS
    common: float = 0.0  # the slowest rank's pace, as the ranks last shared them (0: not shared)
    _per_sample: deque[float] = field(default_factory=deque)

    @property
    def per_sample(self) -> float:
        """This rank's recent pace, in seconds per sample (0 before its first step)."""
        return statistics.median(self._per_sample) if self._per_sample else 0.0

    def share(self, paces: Sequence[float]) -> None:
        """Every rank's pace, as the ranks exchanged them."""
        self.common = max(paces, default=0.0)

    def full_speed_seconds(self, samples: int, measured: float) -> float:
        """Record a step of `samples` samples that took `measured` seconds; its work at full speed."""
        if samples < 1:
            return measured  # a stand-in sample: nothing to learn from, nothing to pace
        self._per_sample.append(measured / samples)
        while len(self._per_sample) > self.window:
            self._per_sample.popleft()
        return samples * (self.common or self.per_sample)
