"""Best-effort FIFO with backfill: the simple policies a user would try before anything clever.

Both serve jobs in priority-then-arrival order and give each exactly gpus.min GPUs of one class; a
job that cannot start is skipped and later jobs may still start (backfill). Nothing is resized or
preempted. They differ only in which class a job gets:

- ``fifo-backfill`` is speed-blind: the allowed class with the most free GPUs (what spreading by
  labels does), ties in the cluster's listed order.
- ``greedy-fastest`` ranks the allowed classes by the job's per-GPU speed as the simulation's
  knowledge gives it (the same profile the other policies see: measured classes, priors for the
  rest) and takes the fastest that has room.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hetero_operator.scheduler import Allocation, Decisions, JobRequest, PriorModel, Snapshot
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.queueing import scheduling_order
from hetero_operator.scheduler.throughput import class_rate_per_gpu
from hetero_operator.simulator.policies.base import commit_first_fitting, decisions

# The engine's default prior: what a job nobody has measured is assumed to do.
PRIOR = PriorModel()
ClassOrder = Callable[[JobRequest, ClusterState, list[str]], list[str]]


def most_free_first(job: JobRequest, state: ClusterState, listed: list[str]) -> list[str]:
    free = state.free_gpus()
    return sorted(listed, key=lambda c: -free[c])


def fastest_first(job: JobRequest, state: ClusterState, listed: list[str]) -> list[str]:
    """By the job's estimated per-GPU rate on each class (`class_rate_per_gpu`: what it measured,
    else a measured class scaled by the priors, else the priors), the same estimate the scheduler's
    predictions use, so greedy-fastest knows what heterotrain knows and no more."""
    catalog = tuple(sorted(state.classes.values(), key=lambda c: c.name))
    speed = {c: class_rate_per_gpu(job, state.classes[c], catalog, PRIOR) for c in listed}
    return sorted(listed, key=lambda c: -speed[c])


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
