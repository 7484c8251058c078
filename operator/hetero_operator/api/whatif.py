"""What the scheduler would do with a job that is not submitted (pure, no side effects).

The job joins a snapshot of the live cluster (behind the jobs already queued, as a new arrival) or of a
pool given in the request, and one `schedule()` cycle runs over it: the same placement, throughput
prediction and first batch split the operator would use. A second cycle without the job tells which
running jobs it alone would push aside.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetero_operator.api.models import (
    ClassReason,
    PoolSource,
    PoolSpec,
    WhatIfRequest,
    WhatIfResult,
)
from hetero_operator.controller.catalog import split_speeds, workload_key
from hetero_operator.controller.decision_effects import status_allocation
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.inventory import job_request
from hetero_operator.controller.plans import PlanBuildError, initial_plan, plan_status
from hetero_operator.controller.wait_reasons import class_wait
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus, MeasuredProfile
from hetero_operator.scheduler import (
    Decisions,
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    SchedulerConfig,
    Snapshot,
    SnapshotError,
    WaitReason,
    schedule,
)
from hetero_operator.scheduler.reasons import format_class


class WhatIfError(ValueError):
    """The job or pool cannot be turned into a scheduler snapshot; the message names the field."""


def pool_snapshot(pool: PoolSpec) -> Snapshot:
    """An empty cluster made of the pool's classes and nodes."""
    classes = tuple(
        GPUClassInfo(
            name=c.name, relative_speed=c.relative_speed, memory_gib=c.memory_gib, cost_weight=c.cost_weight
        )
        for c in pool.classes
    )
    nodes = tuple(
        NodeInfo(
            name=n.name,
            gpu_class=n.gpu_class,
            gpus_allocatable=n.gpus,
            gpus_used_by_others=n.gpus_used,
            schedulable=n.schedulable,
        )
        for n in pool.nodes
    )
    return Snapshot(classes=classes, nodes=nodes, jobs=(), now=0.0)


def unused_key(namespace: str, name: str, taken: set[str]) -> str:
    """`namespace/name`, suffixed if a real job already has that key."""
    candidate, attempt = name, 1
    while f"{namespace}/{candidate}" in taken:
        candidate, attempt = f"{name}-what-if-{attempt}", attempt + 1
    return f"{namespace}/{candidate}"


def hypothetical_job(
    request: WhatIfRequest, key: str, created_at: float, catalog: MeasuredProfile | None = None
) -> tuple[HeteroTrainJob, JobRequest]:
    """The job as the operator would parse it on arrival, and its scheduler request (`catalog`: its
    workload's measured profile, when the throughput catalog has one)."""
    namespace, _, name = key.partition("/")
    job = HeteroTrainJob(metadata={"namespace": namespace, "name": name}, spec=request.spec)
    facts = JobFacts(
        namespace=namespace,
        name=name,
        uid="",
        resource_version="",
        created_at=created_at,
        deleting=False,
        model=job,
    )
    try:
        return job, job_request(facts, job, HeteroTrainJobStatus(), holding=False, catalog=catalog)
    except SnapshotError as error:
        raise WhatIfError(f"spec: {error}") from None


def api_class_reasons(waiting: WaitReason) -> list[ClassReason]:
    """The scheduler's per-class reasons as the API returns them: the data, and the phrase."""
    return [
        ClassReason(
            **class_wait(c).model_dump(), reason=format_class(c).removeprefix(f"class {c.gpu_class}: ")
        )
        for c in waiting.classes
    ]


def _pushed_aside(decisions: Decisions) -> set[str]:
    return set(decisions.preempt) | set(decisions.shrink)


def what_if(
    request: WhatIfRequest,
    base: Snapshot,
    speeds: Mapping[str, float],
    pool_label: PoolSource,
    config: SchedulerConfig | None = None,
    catalog: Mapping[str, MeasuredProfile] | None = None,
) -> WhatIfResult:
    """Add the job to ``base`` as its newest arrival and run one scheduling cycle. ``catalog``: the
    throughput catalog's estimates by workload key, which place and split the job as the operator would."""
    key = unused_key(request.namespace, request.name, {job.key for job in base.jobs})
    estimate = (catalog or {}).get(workload_key(request.spec))
    job, job_req = hypothetical_job(request, key, created_at=base.now, catalog=estimate)
    speeds = split_speeds(request.spec, speeds, estimate)
    try:
        with_job = Snapshot(base.classes, base.nodes, (*base.jobs, job_req), base.now)
    except SnapshotError as error:
        raise WhatIfError(str(error)) from None
    decisions = schedule(with_job, config)
    would_preempt = sorted(_pushed_aside(decisions) - _pushed_aside(schedule(base, config)) - {key})
    placed = decisions.place.get(key)
    if placed is None:
        waiting = decisions.unschedulable.get(key)
        return WhatIfResult(
            pool=pool_label,
            schedulable=False,
            message=waiting.message if waiting is not None else "",
            reason=waiting.code.value if waiting is not None else None,
            class_reasons=api_class_reasons(waiting) if waiting is not None else [],
            would_preempt=would_preempt,
        )
    allocation = status_allocation(placed, 0, None)
    samples_per_second = decisions.predicted_samples_per_second.get(key)
    iteration = job.spec.batch.global_batch / samples_per_second if samples_per_second else None
    try:
        plan = plan_status(initial_plan(job.spec, allocation, speeds, 1, iteration))
    except PlanBuildError as error:
        return WhatIfResult(
            pool=pool_label,
            schedulable=False,
            allocation=allocation,
            message=f"placement refused: {error}",
            class_reasons=[],
            would_preempt=would_preempt,
        )
    return WhatIfResult(
        pool=pool_label,
        schedulable=True,
        allocation=allocation,
        plan=plan,
        predicted_samples_per_second=samples_per_second,
        predicted_iteration_seconds=iteration,
        message="",
        class_reasons=[],
        would_preempt=would_preempt,
    )
