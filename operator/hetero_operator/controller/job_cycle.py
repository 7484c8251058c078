"""One job's way through one cycle (pure): as stored, and what the cycle has decided so far."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hetero_operator.controller.actions import Action, JobWrite
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.status_cache import revision
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus


@dataclass(frozen=True, slots=True)
class JobCycle:
    facts: JobFacts
    stored: HeteroTrainJobStatus
    job: HeteroTrainJob  # carrying the status decided so far
    actions: tuple[Action, ...] = ()

    @property
    def key(self) -> str:
        return self.facts.key

    @property
    def status(self) -> HeteroTrainJobStatus:
        return self.job.status or HeteroTrainJobStatus()

    def with_status(self, status: HeteroTrainJobStatus) -> JobCycle:
        if status is self.status:
            return self
        return replace(self, job=self.job.model_copy(update={"status": status}))

    def then(self, actions: Iterable[Action]) -> JobCycle:
        return replace(self, actions=(*self.actions, *actions))

    def write(self) -> JobWrite | None:
        """The job's writes, or None when the cycle changes nothing."""
        patch = status_patch(self.stored, self.status)
        if not patch and not self.actions:
            return None
        return JobWrite(self.facts, self.job, patch, self.actions)


def status_patch(old: HeteroTrainJobStatus, new: HeteroTrainJobStatus) -> dict[str, Any]:
    """A JSON merge patch from `old` to `new`: only what changed, nulls for what went away, so fields
    other writers own (progress, rebalances) are left alone."""
    return merge_diff(old.to_wire(), new.to_wire())


def merge_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns `before` into `after` (objects recursively)."""
    patch: dict[str, Any] = {}
    for key, value in after.items():
        old = before.get(key)
        if isinstance(old, Mapping) and isinstance(value, Mapping):
            nested = merge_diff(old, value)
            if nested:
                patch[key] = nested
        elif old != value:
            patch[key] = value
    patch.update({key: None for key in before if key not in after})
    return patch


def arrival_times(jobs: Iterable[JobFacts], now: float) -> dict[str, float]:
    """When each job seen for the first time in this cycle joins its queue: ``now`` plus a microsecond
    per job in creation order. creationTimestamp has whole seconds, so within a second the creating
    write's resourceVersion (etcd's global revision) tells which came first."""
    new = [
        f
        for f in jobs
        if f.model is not None and (f.model.status is None or f.model.status.queued_at is None)
    ]
    new.sort(key=lambda f: (f.created_at, revision(f.resource_version), f.key))
    return {facts.key: now + index * 1e-6 for index, facts in enumerate(new)}


def phase_counts(jobs: Mapping[str, JobCycle]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for item in jobs.values():
        phase = item.status.phase
        name = phase.value if phase is not None else "Unknown"
        counts[name] = counts.get(name, 0) + 1
    return counts
