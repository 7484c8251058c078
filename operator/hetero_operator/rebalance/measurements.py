"""What the rebalancer knows about a running job, and the checks that keep nonsense out of it."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerMeasurement:
    """Means over every step one rank ran under one plan version (seconds)."""

    rank: int
    steps: int
    compute_seconds: float
    sync_start_seconds: float
    comm_seconds: float
    step_seconds: float


@dataclass(frozen=True)
class JobMeasurements:
    plan_version: int
    epoch: int | None
    workers: tuple[WorkerMeasurement, ...]
    samples_per_second: float | None = None
    noise_scale: float | None = None
    seconds_since_last_scrape: float | None = None


class MetricsUnavailable(Exception):
    """The metrics cannot be trusted for a decision; the message is the condition's reason text."""


class MissingRanks(MetricsUnavailable):
    """Some rank has no series under the plan: a fault, unless Prometheus has only just come back and
    not scraped every worker yet."""


def check(measured: JobMeasurements, world_size: int, min_steps: int, max_staleness_seconds: float) -> None:
    """Raise MetricsUnavailable unless every rank reported enough finite, non-negative samples."""
    ranks = {w.rank for w in measured.workers}
    missing = sorted(set(range(world_size)) - ranks)
    if missing:
        raise MissingRanks(f"no metrics for rank(s) {missing} at plan version {measured.plan_version}")
    for worker in measured.workers:
        values = {
            "compute": worker.compute_seconds,
            "sync start": worker.sync_start_seconds,
            "communication": worker.comm_seconds,
            "step": worker.step_seconds,
        }
        for name, value in values.items():
            if not math.isfinite(value):
                raise MetricsUnavailable(f"rank {worker.rank} reported a non-finite {name} time ({value})")
            if value < 0:
                raise MetricsUnavailable(f"rank {worker.rank} reported a negative {name} time ({value})")
        if worker.compute_seconds == 0:
            raise MetricsUnavailable(f"rank {worker.rank} reported zero compute time")
    stale = measured.seconds_since_last_scrape
    if stale is not None and (not math.isfinite(stale) or stale > max_staleness_seconds):
        raise MetricsUnavailable(f"the newest worker sample is {stale:.0f}s old (stale series)")
    short = sorted(w.rank for w in measured.workers if w.steps < min_steps)
    if short:
        raise NotEnoughSamples(f"rank(s) {short} ran fewer than {min_steps} steps under this plan")


class NotEnoughSamples(Exception):
    """Too early to decide: not a fault, so no condition is raised; try again later."""
