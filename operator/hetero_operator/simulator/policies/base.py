"""What every scheduling policy gives the engine: `decide(snapshot) -> Decisions`, the operator's shape."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Protocol

from hetero_operator.scheduler import (
    Allocation,
    CycleMetrics,
    Decisions,
    JobRequest,
    Preemption,
    Resize,
    Snapshot,
)
from hetero_operator.scheduler.free_index import ClusterState, NodeTake
from hetero_operator.scheduler.placement import data_parallel_allocation
from hetero_operator.scheduler.reasons import WaitCode, WaitReason


class SchedulingPolicy(Protocol):
    """``pipelines``: runs models that do not fit one GPU as HetPipe virtual workers.
    ``round_s``: decide only every so many seconds (time-sharing rounds); ``None`` = on events."""

    name: str
    pipelines: bool
    round_s: float | None

    def decide(self, snapshot: Snapshot) -> Decisions: ...


def take_one_class(
    state: ClusterState, gpu_class: str, count: int
) -> tuple[list[NodeTake], Allocation] | None:
    """``count`` free GPUs of one class on as few nodes as the free index finds, or ``None``."""
    picks = state.free[gpu_class].plan(count)
    if picks is None:
        return None
    return picks, data_parallel_allocation(Counter(dict(picks)), state)


def commit_first_fitting(state: ClusterState, job: JobRequest, classes: Iterable[str]) -> Allocation | None:
    """The job's `gpus.min` GPUs on the first of `classes` that has them free, committed to `state`."""
    for gpu_class in classes:
        taken = take_one_class(state, gpu_class, job.gpus_min)
        if taken is not None:
            picks, allocation = taken
            state.commit(job.key, picks)
            return allocation
    return None


def decisions(
    snapshot: Snapshot,
    state: ClusterState,
    place: Mapping[str, Allocation],
    unschedulable: Mapping[str, str],
    predicted: Mapping[str, float],
    preempt: Mapping[str, Preemption] | None = None,
    grow: Mapping[str, Resize] | None = None,
) -> Decisions:
    """Pack a baseline's choices with the counts the operator would export."""
    allocated: Counter[str] = Counter({c.name: 0 for c in snapshot.classes})
    for per_node in state.held.values():
        for node, count in per_node.items():
            allocated[state.class_of(node)] += count
    waiting = Counter(j.queue for j in snapshot.jobs if j.key in unschedulable)
    requests = {j.key: j for j in snapshot.jobs}
    reasons = {
        key: WaitReason(
            WaitCode.WAITING_FOR_GPUS, requests[key].gpus_min, queue=requests[key].queue, note=text
        )
        for key, text in unschedulable.items()
    }
    return Decisions(
        place=dict(place),
        grow=dict(grow or {}),
        shrink={},
        preempt=dict(preempt or {}),
        unschedulable=reasons,
        predicted_samples_per_second=dict(predicted),
        metrics=CycleMetrics(
            queue_length=dict(sorted(waiting.items())),
            gpus_allocated=dict(allocated),
            gpus_free=state.free_gpus(),
            jobs_placed=len(place),
            jobs_preempted=len(preempt or {}),
            jobs_resized=len(grow or {}),
        ),
    )
