"""A HeteroTrainJob as the API and the CLI show it (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from hetero_operator.api.models import JobDetail, JobSummary
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.job_conditions import ConditionType
from hetero_operator.resources import ConditionStatus, HeteroTrainJobStatus, Phase

# Which condition explains a job's state, per phase: (condition, the status that means trouble).
_EXPLAINED_BY: dict[Phase, tuple[tuple[ConditionType, ConditionStatus], ...]] = {
    Phase.QUEUED: ((ConditionType.PLACED, ConditionStatus.FALSE),),
    Phase.FAILED: (
        (ConditionType.FAILED, ConditionStatus.TRUE),
        (ConditionType.VALID, ConditionStatus.FALSE),
    ),
    Phase.RESTARTING: ((ConditionType.RESTARTING, ConditionStatus.TRUE),),
    Phase.STARTING: ((ConditionType.DRAINING, ConditionStatus.TRUE),),
    Phase.RUNNING: ((ConditionType.DRAINING, ConditionStatus.TRUE),),
}


def status_message(status: HeteroTrainJobStatus) -> str:
    """The condition message that says why a job waits, fails, restarts or is being stopped."""
    if status.phase is None:
        return ""
    for kind, troubled in _EXPLAINED_BY.get(status.phase, ()):
        for condition in status.conditions:
            if condition.type == kind.value and condition.status is troubled:
                return condition.message
    return ""


def job_summary(facts: JobFacts) -> JobSummary:
    created = datetime.fromtimestamp(facts.created_at, UTC) if facts.created_at else None
    model = facts.model
    if model is None:
        return JobSummary(
            namespace=facts.namespace,
            name=facts.name,
            gpus=0,
            classes="",
            epoch=0,
            restarts=0,
            created=created,
            message="invalid spec: " + "; ".join(facts.problems),
        )
    status = model.status or HeteroTrainJobStatus()
    allocation = status.allocation
    progress = status.progress
    return JobSummary(
        namespace=facts.namespace,
        name=facts.name,
        phase=status.phase,
        strategy=model.spec.parallelism.strategy,
        queue=model.spec.queue,
        priority=model.spec.priority,
        gpus=allocation.total_gpus if allocation is not None else 0,
        classes=allocation.classes if allocation is not None else "",
        epoch=progress.epoch if progress is not None else 0,
        epochs=model.spec.epochs,
        samples_per_second=progress.samples_per_second if progress is not None else None,
        restarts=status.restarts,
        created=created,
        message=status_message(status),
    )


def job_detail(facts: JobFacts) -> JobDetail:
    summary = job_summary(facts).model_dump()
    model = facts.model
    if model is None:
        return JobDetail(
            **summary, gpu_classes=[], rebalances=[], conditions=[], problems=list(facts.problems)
        )
    spec = model.spec
    status = model.status or HeteroTrainJobStatus()
    return JobDetail(
        **summary,
        gpus_min=spec.gpus.min,
        gpus_max=spec.gpus.max,
        gpu_classes=list(spec.gpu_classes),
        global_batch=spec.batch.global_batch,
        allocation=status.allocation,
        plan=status.plan,
        progress=status.progress,
        rebalances=list(status.rebalances),
        waiting=status.waiting,
        conditions=list(status.conditions),
        problems=[],
    )
