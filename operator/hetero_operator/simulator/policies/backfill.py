"""Best-effort FIFO with backfill: the simple policies a user would try before anything clever.

Both serve jobs in priority-then-arrival order and give each exactly gpus.min GPUs of one class; a
job that cannot start is skipped and later jobs may still start (backfill). Nothing is resized or
preempted. They differ only in which class a job gets:

- ``fifo-backfill`` is speed-blind: the allowed class with the most free GPUs (what spreading by
  labels does), ties in the cluster's listed order.
- ``greedy-fastest`` knows each job's per-GPU speed on each class (the same measured profile the
  other policies see) and takes the fastest allowed class that has room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetero_operator.scheduler import Allocation, Decisions, JobRequest, Snapshot
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.queueing import scheduling_order
from hetero_operator.simulator.policies.base import commit_first_fitting, decisions

ClassOrder = Callable[[JobRequest, ClusterState, list[str]], list[str]]


def most_free_first(job: JobRequest, state: ClusterState, listed: list[str]) -> list[str]:
    free = state.free_gpus()
    return sorted(listed, key=lambda c: -free[c])


def fastest_first(job: JobRequest, state: ClusterState, listed: list[str]) -> list[str]:
    """By the job's own per-GPU step rate on each class; the class prior where nothing is measured."""
    measured = dict(job.profile.per_class) if job.profile is not None else {}
    batch = job.global_batch / job.gpus_min

    def speed(gpu_class: str) -> float:
        profile = measured.get(gpu_class)
        if profile is None:
            return state.classes[gpu_class].relative_speed
        return batch / (profile.alpha_ms * batch + profile.beta_ms)

    return sorted(listed, key=lambda c: -speed(c))


def backfill_one_class(snapshot: Snapshot, class_order: ClassOrder) -> Decisions:
    state = ClusterState(snapshot)
    listed = [c.name for c in snapshot.classes]
    place: dict[str, Allocation] = {}
    waiting: dict[str, str] = {}
    for job in scheduling_order(j for j in snapshot.jobs if j.current is None):
        allowed = [c for c in listed if job.allows(c)]
        allocation = commit_first_fitting(state, job, class_order(job, state, allowed))
        if allocation is not None:
            place[job.key] = allocation
        else:
            waiting[job.key] = f"no allowed class has {job.gpus_min} free GPUs (later jobs may start)"
    return decisions(snapshot, state, place, waiting, {})


@dataclass(slots=True)
class FifoBackfillPolicy:
    name: str = "fifo-backfill"
    pipelines: bool = False
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        return backfill_one_class(snapshot, most_free_first)


@dataclass(slots=True)
class GreedyFastestPolicy:
    name: str = "greedy-fastest"
    pipelines: bool = False
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        return backfill_one_class(snapshot, fastest_first)
