"""Every running job's epoch and throughput from Prometheus in two queries a tick, whatever the
number of jobs: the progress reporter writes them to `status.progress` (also for jobs with
rebalancing off), and each job's rebalancer reads them to know when a decision is due, so it asks
Prometheus for a job's full measurements only then."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from hetero_operator import metric_names as names
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.k8s import path_of
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.measurements import MetricsUnavailable
from hetero_operator.rebalance.tasks import running
from hetero_operator.resources import Progress

log = logging.getLogger("heterotrain.progress")

RECENT_EPOCHS = 3
# Within an epoch, progress is written again only when the rate moved by more than this.
RATE_CHANGE = 0.05


@dataclass(frozen=True, slots=True)
class JobSample:
    epoch: int | None = None
    samples_per_second: float | None = None


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What Prometheus said at one moment, for every job it has series of (key: namespace/name)."""

    reachable: bool
    jobs: Mapping[str, JobSample] = field(default_factory=dict)
    error: str = ""

    def of(self, key: str) -> JobSample:
        return self.jobs.get(key, JobSample())


def snapshot_queries() -> dict[str, str]:
    by = f"by ({names.LABEL_NAMESPACE}, {names.LABEL_JOB})"
    return {
        "epoch": f"max {by} ({names.EPOCH})",
        "samples_per_second": f"sum {by} (rate({names.total(names.SAMPLES)}[{promql.RATE_WINDOW}]))",
    }


def parse_snapshot(answers: promql.Answers) -> MetricsSnapshot:
    """Answers by (namespace, job) as one sample per job (pure)."""
    jobs: dict[str, JobSample] = {}
    for kind in ("epoch", "samples_per_second"):
        for labels, value in answers.get(kind, []):
            namespace, job = labels.get(names.LABEL_NAMESPACE), labels.get(names.LABEL_JOB)
            if not namespace or not job or not math.isfinite(value) or value < 0:
                continue
            key = f"{namespace}/{job}"
            sample = jobs.get(key, JobSample())
            if kind == "epoch":
                jobs[key] = JobSample(int(value), sample.samples_per_second)
            else:
                jobs[key] = JobSample(sample.epoch, value)
    return MetricsSnapshot(True, jobs)


async def fetch_snapshot(http: httpx.AsyncClient, prometheus_url: str) -> MetricsSnapshot:
    try:
        return parse_snapshot(await promql.ask(http, prometheus_url, snapshot_queries()))
    except MetricsUnavailable as why:
        return MetricsSnapshot(False, error=str(why))


# --- progress ------------------------------------------------------------------------------------


def eta_seconds(
    epoch_started: Mapping[int, float], epoch: int, epochs: int, now: float | None = None
) -> float | None:
    """Remaining epochs times the mean duration of the last few whole epochs seen, less what the
    current epoch has run by ``now`` (in the clock of ``epoch_started``) when given."""
    seen = sorted(epoch_started.items())
    durations = [b[1] - a[1] for a, b in itertools.pairwise(seen) if b[0] == a[0] + 1]
    if not durations:
        return None
    recent = durations[-RECENT_EPOCHS:]
    into = now - epoch_started[epoch] if now is not None and epoch in epoch_started else 0.0
    return max(0.0, (epochs - epoch) * sum(recent) / len(recent) - max(0.0, into))


def progress_of(epoch: int, rate: float | None, eta: float | None, at: datetime | None = None) -> Progress:
    return Progress(
        epoch=epoch,
        samples_per_second=round(rate, 2) if rate is not None else 0.0,
        eta_seconds=round(eta, 1) if eta is not None else None,
        updated_at=at,
    )


def worth_writing(written: Progress | None, progress: Progress) -> bool:
    """A new epoch, or a rate that moved noticeably: not a write every tick for rate noise."""
    if written is None or written.epoch != progress.epoch:
        return True
    before, now = written.samples_per_second, progress.samples_per_second
    return abs(now - before) > RATE_CHANGE * max(before, 1e-9)


class StatusPatcher(Protocol):
    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...


@dataclass
class _JobProgress:
    epoch_started: dict[int, float] = field(default_factory=dict)  # epoch -> monotonic time first seen
    written: Progress | None = None


class JobMetricsPoller:
    """One task for all running jobs (a `JobTasks` of the scheduling loop): polls Prometheus, keeps
    the newest snapshot for the rebalancers, and writes each job's progress when it changed."""

    def __init__(
        self, client: StatusPatcher, http: httpx.AsyncClient, prometheus_url: str, clock: Clock, tick: float
    ) -> None:
        self.client = client
        self.http = http
        self.prometheus_url = prometheus_url
        self.clock = clock
        self.tick_seconds = tick
        self.latest: MetricsSnapshot | None = None
        self._running: dict[str, JobFacts] = {}
        self._progress: dict[str, _JobProgress] = {}
        self._task: asyncio.Task[None] | None = None

    def sync(self, jobs: Mapping[str, JobFacts]) -> None:
        self._running = {key: facts for key, facts in jobs.items() if running(facts)}
        self._progress = {k: v for k, v in self._progress.items() if k in self._running}
        if self._task is None and self._running:
            self._task = asyncio.create_task(self._poll(), name="job metrics")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _poll(self) -> None:
        while True:
            try:
                await self.poll_once()
            except Exception as err:  # a failed pass must never end the reporting
                log.warning("job metrics pass failed: %s", err)
            await self.clock.sleep(self.tick_seconds)

    async def poll_once(self) -> MetricsSnapshot:
        snapshot = await fetch_snapshot(self.http, self.prometheus_url)
        self.latest = snapshot
        for key, facts in list(self._running.items()):
            sample = snapshot.of(key)
            if sample.epoch is not None and facts.model is not None:
                await self._report(key, facts, sample)
        return snapshot

    async def _report(self, key: str, facts: JobFacts, sample: JobSample) -> None:
        assert sample.epoch is not None and facts.model is not None
        memory = self._progress.setdefault(key, _JobProgress())
        now = self.clock.monotonic()
        memory.epoch_started.setdefault(sample.epoch, now)
        eta = eta_seconds(memory.epoch_started, sample.epoch, facts.model.spec.epochs, now)
        at = datetime.fromtimestamp(self.clock.time(), tz=UTC)
        progress = progress_of(sample.epoch, sample.samples_per_second, eta, at)
        if worth_writing(memory.written, progress):
            path = path_of("HeteroTrainJob", facts.namespace, facts.name, "status")
            wire = {**progress.to_wire(), "etaSeconds": progress.eta_seconds}  # null clears an old ETA
            await self.client.merge_patch(path, {"status": {"progress": wire}})
            memory.written = progress
