"""Simulated heterogeneity for machines without GPUs: stretch each step's compute to 1/speed.

The compute is measured as the CPU time this process spent on it, so time lost to other processes
on a shared host is not multiplied by 1/speed; the stretched step lasts max(wall time, CPU time /
speed). The extra time is spent sleeping, so a "slow" worker does not steal CPU from its peers:
its compute time grows as a slower GPU's would.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


def stretched_seconds(measured_seconds: float, speed: float) -> float:
    """How long compute measured at `measured_seconds` takes at `speed` (fraction of full speed)."""
    return measured_seconds / speed


@dataclass(frozen=True)
class Stopwatch:
    wall: float
    cpu: float


class SpeedSimulator:
    def __init__(self, speed: float | None) -> None:
        self.speed = 1.0 if speed is None else speed
        self.active = speed is not None and speed < 1.0

    def announce(self, rank: int) -> None:
        if self.active:
            log.warning(
                "SIMULATION: rank %d runs at simulated speed %.3g: every step's compute is stretched to "
                "%.3gx its measured time by sleeping",
                rank,
                self.speed,
                1.0 / self.speed,
            )

    def begin(self) -> Stopwatch:
        return Stopwatch(time.perf_counter(), time.process_time())

    def finish(self, watch: Stopwatch) -> float:
        """End a compute segment: sleep until it lasts CPU time / speed; returns its duration."""
        wall = time.perf_counter() - watch.wall
        if not self.active:
            return wall
        target = stretched_seconds(time.process_time() - watch.cpu, self.speed)
        if target > wall:
            time.sleep(target - wall)
        return max(wall, target)
