"""What each of the scheduler's decisions does to a job (pure): its new status and the actions that
follow. The operator and the simulator act on the same `Decisions`: a placement starts the job on
exactly its allocation, a resize drains the job and restarts it on exactly the new allocation, a
preemption drains it back into the queue, and a waiting job's status says why, class by class."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetero_operator.controller.actions import (
    CreateGeneration,
    PostEvent,
    PublishPlan,
    RequestCheckpoint,
)
from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.job_conditions import ConditionType, is_true
from hetero_operator.controller.job_cycle import JobCycle
from hetero_operator.controller.lifecycle import JobEvent
from hetero_operator.controller.plans import PlanBuildError, initial_plan, plan_status
from hetero_operator.controller.transitions import (
    HOLDING_PHASES,
    DrainReason,
    draining,
    next_generation,
    placed,
    plan_refused,
    resizing,
    waiting,
)
from hetero_operator.resources import Allocation as StatusAllocation
from hetero_operator.resources import WorkerAllocation
from hetero_operator.scheduler import Allocation, Decisions


@dataclass(frozen=True, slots=True)
class Effects:
    jobs: dict[str, JobCycle]
    placements: int = 0
    preemptions: int = 0
    first_placement_seconds: tuple[float, ...] = ()
    wake_in: float | None = None


def status_allocation(allocation: Allocation, generation: int, predicted: float | None) -> StatusAllocation:
    workers = [
        WorkerAllocation(
            rank=slot.rank,
            node=slot.node,
            gpu_class=slot.gpu_class,
            gpus=slot.gpus,
            virtual_worker=slot.virtual_worker,
            stage=slot.stage,
        )
        for slot in allocation.workers
    ]
    return StatusAllocation.from_workers(workers, generation, predicted)


def apply_decisions(
    decisions: Decisions, jobs: Mapping[str, JobCycle], view: ClusterView, now: float, grace: float
) -> Effects:
    out = dict(jobs)
    placements, firsts = 0, []
    for key, allocation in decisions.place.items():
        predicted = decisions.predicted_samples_per_second.get(key)
        out[key], generation = place(out[key], allocation, predicted, view, now)
        placements += generation is not None
        if generation == 0:
            firsts.append(max(0.0, now - out[key].facts.created_at))
    for key, reason in decisions.unschedulable.items():
        out[key] = out[key].with_status(waiting(out[key].job, reason, now))
    stopped = 0  # jobs stopped to make room (a growth stops a job too, but for its own good)
    for key, preemption in decisions.preempt.items():
        out[key], did = preempt(out[key], preemption.reason, view, now)
        stopped += did
    for key, resize in [*decisions.shrink.items(), *decisions.grow.items()]:
        predicted = decisions.predicted_samples_per_second.get(key)
        out[key], did = resize_in_place(out[key], resize.allocation, predicted, resize.reason, view, now)
        stopped += did and key in decisions.shrink
    wake = grace if decisions.preempt or decisions.shrink or decisions.grow else None
    return Effects(out, placements, stopped, tuple(firsts), wake)


def place(
    item: JobCycle, allocation: Allocation, predicted: float | None, view: ClusterView, now: float
) -> tuple[JobCycle, int | None]:
    """Start a queued job on `allocation`: status first, then its plan, objects and an Event.
    Returns the job and the generation it starts (None: its plan could not be built)."""
    job, status = item.job, item.status
    generation = next_generation(status.allocation)
    chosen = status_allocation(allocation, generation, predicted)
    version = status.plan.version + 1 if status.plan is not None else 1
    iteration = job.spec.batch.global_batch / predicted if predicted else None
    try:
        plan = initial_plan(job.spec, chosen, view.job_speeds(job, status), version, iteration)
    except PlanBuildError as error:
        return item.with_status(plan_refused(job, f"placement refused: {error}", now)), None
    message = f"placed on {chosen.total_gpus} GPUs ({chosen.classes}), worker generation {generation}"
    placed_item = item.with_status(placed(job, chosen, plan_status(plan), now)).then(
        (
            PublishPlan(plan),
            CreateGeneration(generation, None, view.launch_classes()),
            PostEvent(JobEvent("Normal", "Placed", message)),
        )
    )
    return placed_item, generation


def _stoppable(item: JobCycle) -> bool:
    status = item.status
    return status.phase in HOLDING_PHASES and not is_true(status, ConditionType.DRAINING)


def _live_pods(item: JobCycle, view: ClusterView) -> tuple[str, ...]:
    return tuple(p.name for p in view.pods_of(item.key) if p.live and not p.deleting)


def preempt(item: JobCycle, reason: str, view: ClusterView, now: float) -> tuple[JobCycle, bool]:
    """Checkpoint first, then back to the queue (the lifecycle finishes the drain)."""
    if not _stoppable(item):
        return item, False
    event = JobEvent("Normal", DrainReason.PREEMPTED.value, f"{reason}; saving a checkpoint first")
    status = draining(item.job, DrainReason.PREEMPTED, reason, now)
    pods = _live_pods(item, view)
    return item.with_status(status).then((RequestCheckpoint(pods), PostEvent(event))), True


def resize_in_place(
    item: JobCycle,
    allocation: Allocation,
    predicted: float | None,
    reason: str,
    view: ClusterView,
    now: float,
) -> tuple[JobCycle, bool]:
    """Checkpoint first, then restart on exactly `allocation` (held from now on)."""
    if not _stoppable(item):
        return item, False
    target = status_allocation(allocation, next_generation(item.status.allocation), predicted)
    event = JobEvent("Normal", DrainReason.RESIZED.value, f"{reason}; saving a checkpoint first")
    status = resizing(item.job, target, reason, now)
    pods = _live_pods(item, view)
    return item.with_status(status).then((RequestCheckpoint(pods), PostEvent(event))), True
