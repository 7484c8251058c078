"""The status changes the scheduling cycle makes from its own decisions (pure): a job validated,
found invalid, placed, left waiting, asked to drain for a preemption, or resized in place."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum

from hetero_operator.controller.job_conditions import (
    ConditionType,
    condition,
    set_condition,
)
from hetero_operator.controller.wait_reasons import waiting_of
from hetero_operator.resources import (
    Allocation,
    ConditionStatus,
    HeteroTrainJob,
    HeteroTrainJobStatus,
    Phase,
    Plan,
)
from hetero_operator.scheduler import WaitReason

HOLDING_PHASES = frozenset({Phase.STARTING, Phase.RUNNING, Phase.RESTARTING})
TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class DrainReason(StrEnum):
    PREEMPTED = "Preempted"
    RESIZED = "Resized"
    SUSPENDED = "Suspended"
    EVICTED = "Evicted"  # Kueue took the job's admission away


def status_of(job: HeteroTrainJob) -> HeteroTrainJobStatus:
    return job.status or HeteroTrainJobStatus()


def queued(job: HeteroTrainJob, now: float) -> HeteroTrainJobStatus:
    """A freshly validated job."""
    status = status_of(job)
    status = set_condition(status, ConditionType.VALID, True, "Validated", "the spec is valid", now)
    arrival = status.queued_at or datetime.fromtimestamp(now, UTC)
    return status.model_copy(
        update={"phase": Phase.QUEUED, "observed_generation": job.generation, "queued_at": arrival}
    )


def validated(job: HeteroTrainJob, now: float) -> HeteroTrainJobStatus:
    """The status of a job whose spec passes validation: a new job, or one that failed validation
    and was fixed, is queued; a job that kept its GPUs while its spec was invalid just becomes Valid."""
    status = status_of(job)
    found = condition(status, ConditionType.VALID)
    was_invalid = found is not None and found.status is ConditionStatus.FALSE
    if status.phase is None or (status.phase is Phase.FAILED and was_invalid):
        return queued(job, now)
    if was_invalid:
        return set_condition(status, ConditionType.VALID, True, "Validated", "the spec is valid", now)
    return status


def invalid(
    job_status: HeteroTrainJobStatus | None, problems: Sequence[str], now: float
) -> HeteroTrainJobStatus:
    """Valid=False naming the problems. A job holding GPUs keeps its phase (its workers are left as they
    are until the spec is fixed or the job deleted); any other job is Failed."""
    status = job_status or HeteroTrainJobStatus()
    status = set_condition(status, ConditionType.VALID, False, "InvalidSpec", "; ".join(problems), now)
    if status.phase in HOLDING_PHASES:
        return status
    return status.model_copy(update={"phase": Phase.FAILED})


def placed(job: HeteroTrainJob, allocation: Allocation, plan: Plan, now: float) -> HeteroTrainJobStatus:
    status = status_of(job)
    message = f"{allocation.total_gpus} GPUs ({allocation.classes}) on {node_count(allocation)} nodes"
    if allocation.predicted_samples_per_second:
        message += f", predicted {allocation.predicted_samples_per_second:.1f} samples/s"
    status = set_condition(status, ConditionType.PLACED, True, "Placed", message, now)
    status = set_condition(
        status, ConditionType.PODS_READY, False, "PodsStarting", "creating the workers", now
    )
    return status.model_copy(
        update={
            "phase": Phase.STARTING,
            "allocation": allocation,
            "waiting": None,
            "plan": plan,
            "observed_generation": job.generation,
            "started_at": status.started_at or datetime.fromtimestamp(now, UTC),
        }
    )


def waiting(job: HeteroTrainJob, reason: WaitReason, now: float) -> HeteroTrainJobStatus:
    """Placed=False with the scheduler's reason; `status.waiting` keeps it as data."""
    status = status_of(job)
    status = set_condition(status, ConditionType.PLACED, False, reason.code.value, reason.message, now)
    found = waiting_of(reason)
    return status if status.waiting == found else status.model_copy(update={"waiting": found})


def plan_refused(job: HeteroTrainJob, problem: str, now: float) -> HeteroTrainJobStatus:
    """The placement's first plan could not be built: the job keeps waiting, saying why."""
    status = status_of(job)
    return set_condition(status, ConditionType.PLACED, False, "PlanRefused", problem, now)


def draining(job: HeteroTrainJob, reason: DrainReason, message: str, now: float) -> HeteroTrainJobStatus:
    """Start a checkpoint-first stop; the lifecycle finishes it once the grace period is over."""
    return set_condition(status_of(job), ConditionType.DRAINING, True, reason.value, message, now)


def resizing(job: HeteroTrainJob, target: Allocation, message: str, now: float) -> HeteroTrainJobStatus:
    """Drain for a resize: the job holds `target` from now on (a new generation), its old workers
    save a checkpoint, and the lifecycle starts the new generation once they are gone."""
    status = draining(job, DrainReason.RESIZED, message, now)
    text = f"resizing to {target.total_gpus} GPUs ({target.classes}) on {node_count(target)} nodes"
    status = set_condition(status, ConditionType.PLACED, True, "Resizing", text, now)
    return status.model_copy(update={"allocation": target})


def next_generation(allocation: Allocation | None) -> int:
    return 0 if allocation is None else allocation.generation + 1


def node_count(allocation: Allocation) -> int:
    return len({w.node for w in allocation.workers})


def released(allocation: Allocation | None) -> Allocation | None:
    """No GPUs, but the generation is kept so the next placement's pod names are new."""
    if allocation is None:
        return None
    return Allocation.from_workers([], generation=allocation.generation)
