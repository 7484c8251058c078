"""`status.progress` of every running job (epoch, samples/s, ETA), from what Prometheus scraped off
its workers: a task of its own, so jobs with rebalancing off show their progress too."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from hetero_operator.controller.clock import Clock
from hetero_operator.controller.k8s import path_of
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.measurements import MetricsUnavailable
from hetero_operator.resources import HeteroTrainJob, Progress

RECENT_EPOCHS = 3
# Within an epoch, progress is written again only when the rate moved by more than this.
RATE_CHANGE = 0.05


class StatusPatcher(Protocol):
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...


@dataclass
class ProgressMemory:
    epoch_started: dict[int, float] = field(default_factory=dict)  # epoch -> monotonic time first seen
    written: Progress | None = None


def eta_seconds(epoch_started: Mapping[int, float], epoch: int, epochs: int) -> float | None:
    """Remaining epochs times the mean duration of the last few whole epochs seen."""
    seen = sorted(epoch_started.items())
    durations = [b[1] - a[1] for a, b in itertools.pairwise(seen) if b[0] == a[0] + 1]
    if not durations:
        return None
    recent = durations[-RECENT_EPOCHS:]
    return max(0.0, (epochs - epoch) * sum(recent) / len(recent))


def progress_of(epoch: int, rate: float | None, eta: float | None) -> Progress:
    return Progress(
        epoch=epoch,
        samples_per_second=round(rate, 2) if rate is not None else 0.0,
        eta_seconds=round(eta, 1) if eta is not None else None,
    )


class ProgressReporter:
    def __init__(
        self, client: StatusPatcher, http: httpx.AsyncClient, prometheus_url: str, clock: Clock
    ) -> None:
        self.client = client
        self.http = http
        self.prometheus_url = prometheus_url
        self.clock = clock

    async def tick(self, job: HeteroTrainJob, memory: ProgressMemory) -> Progress | None:
        """Write the job's progress if it changed; None while the workers have reported no epoch."""
        try:
            epoch, rate = await promql.fetch_progress(self.http, self.prometheus_url, job.namespace, job.name)
        except MetricsUnavailable:
            return None  # the rebalancer's condition says so; progress just stands still
        if epoch is None:
            return None
        memory.epoch_started.setdefault(epoch, self.clock.monotonic())
        progress = progress_of(epoch, rate, eta_seconds(memory.epoch_started, epoch, job.spec.epochs))
        if worth_writing(memory.written, progress):
            path = path_of("HeteroTrainJob", job.namespace, job.name, "status")
            wire = {**progress.to_wire(), "etaSeconds": progress.eta_seconds}  # null clears an old ETA
            await self.client.merge_patch(path, {"status": {"progress": wire}})
            memory.written = progress
        return progress


def worth_writing(written: Progress | None, progress: Progress) -> bool:
    """A new epoch, or a rate that moved noticeably: not a write every tick for rate noise."""
    if written is None or written.epoch != progress.epoch:
        return True
    before, now = written.samples_per_second, progress.samples_per_second
    return abs(now - before) > RATE_CHANGE * max(before, 1e-9)
