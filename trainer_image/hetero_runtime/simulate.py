"""Simulated heterogeneity for machines without GPUs: stretch each step's compute to 1/speed.

The compute is measured as the CPU time of the calling thread (the runtime runs torch on one
thread), so neither time lost to other processes on a shared host nor the CPU used meanwhile by the
worker's other threads (metrics server, plan watcher, gloo's I/O) is multiplied by 1/speed; the
stretched segment lasts max(wall time, CPU time / speed). The extra time is spent sleeping, so a
"slow" worker does not steal CPU from its peers: its compute time grows as a slower GPU's would.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)


def stretched_seconds(measured_seconds: float, speed: float) -> float:
    """How long compute measured at `measured_seconds` takes at `speed` (fraction of full speed)."""
    return measured_seconds / speed


@dataclass(frozen=True)
class Stopwatch:
    wall: float
    cpu: float  # CPU time of the thread that began the segment
    thread: int


class SpeedSimulator:
    def __init__(self, speed: float | None) -> None:
        self.speed = 1.0 if speed is None else speed
        self.active = speed is not None and speed < 1.0
        # Wall time beyond CPU time / speed, summed: time a busy host took from the compute thread
        # that sleeping could not absorb, so the simulated speed was not met exactly.
        self.overrun_seconds = 0.0

    def announce(self, rank: int) -> None:
        if self.active:
            log.warning(
                "SIMULATION: rank %d runs at simulated speed %.3g: every step's compute is stretched to "
                "%.3gx its measured CPU time by sleeping",
                rank,
                self.speed,
                1.0 / self.speed,
            )

    def begin(self) -> Stopwatch:
        return Stopwatch(time.perf_counter(), time.thread_time(), threading.get_ident())

    def pace(self, watch: Stopwatch) -> None:
        """Inside a compute segment (after one of its micro-batches, say): sleep until the segment so
        far lasts its CPU time / speed. A slow GPU works at its pace all through a step; stretching
        only at the end would run every worker's compute in one burst at the start of the step,
        where the bursts of workers sharing a host's cores collide."""
        if self.active:
            self._stretch(watch, count_overrun=False)

    def finish(self, watch: Stopwatch) -> float:
        """End a compute segment (on the thread that began it): sleep until it lasts CPU time /
        speed; returns the segment's duration as measured after the sleep."""
        if self.active:
            self._stretch(watch, count_overrun=True)
        return time.perf_counter() - watch.wall

    def _stretch(self, watch: Stopwatch, count_overrun: bool) -> None:
        if threading.get_ident() != watch.thread:
            raise RuntimeError("SpeedSimulator: a segment must end on the thread that called begin()")
        wall = time.perf_counter() - watch.wall
        target = stretched_seconds(time.thread_time() - watch.cpu, self.speed)
        if target > wall:
            time.sleep(target - wall)
        elif count_overrun:
            self.overrun_seconds += wall - target
