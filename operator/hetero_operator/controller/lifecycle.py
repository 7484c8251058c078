"""A job's life as pure functions: observed pods and status in, next status and actions out.

Phases: Queued -> Starting -> Running -> Succeeded | Failed, plus Restarting (a worker failed: the
group restarts on the same GPUs from its checkpoint after a doubling backoff, up to
`restartPolicy.maxRestarts`) and Suspended. A lost node (deleted or NotReady) re-queues the job and
the scheduler places it again. Stopping for preemption or suspension is "checkpoint first": the
pods are asked to save (an annotation), given a grace period, then deleted. A resize is the same
drain, after which the job starts on exactly the GPUs the scheduler chose (a new generation), with
a new plan for its new size.

An allocation keeps a generation number that only grows; pod names carry it, so pods of an earlier
generation can never be mistaken for the current ones, and a new generation never starts while
pods of an older one still run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from enum import StrEnum

from hetero_operator.controller import limits, names
from hetero_operator.controller.facts import PodFacts
from hetero_operator.controller.job_conditions import (
    ConditionType,
    clear_condition,
    condition,
    is_true,
    set_condition,
)
from hetero_operator.controller.lifecycle_step import JobEvent, LifecycleConfig, Observation, Step
from hetero_operator.controller.plans import PlanBuildError, initial_plan, plan_status
from hetero_operator.controller.transitions import (
    HOLDING_PHASES,
    TERMINAL_PHASES,
    DrainReason,
    draining,
    released,
)
from hetero_operator.resources import Allocation, HeteroTrainJob, HeteroTrainJobStatus, Phase

# --- the reconcile step --------------------------------------------------------------------------


def reconcile(seen: Observation, config: LifecycleConfig) -> Step:
    """The next status and actions for one job, from its status, its pods and the time."""
    status = seen.job.status or HeteroTrainJobStatus()
    if status.phase is None or not is_true(status, ConditionType.VALID):
        return Step(status)
    step = limits.over_limit(seen, status, config) or _step(seen, status, config)
    return limits.with_times(step, seen, config)


def _step(seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig) -> Step:
    job, phase, pods = seen.job, status.phase, seen.pods
    if phase in TERMINAL_PHASES:
        leftovers = [p for p in pods if p.live and not p.deleting] + _stale(pods, status)
        return Step(status, delete_pods=_names({p.name: p for p in leftovers}.values()))
    if phase is Phase.SUSPENDED:
        return _suspended(seen, status)
    allocation = status.allocation
    workers = allocation.workers if allocation is not None else []
    if is_true(status, ConditionType.DRAINING):
        return _drain(seen, status, config)
    if job.spec.suspend:
        return _suspend(seen, status, config)
    if phase is Phase.QUEUED or not workers:
        stopping = _names(p for p in pods if p.live and not p.deleting)
        return Step(status, delete_pods=stopping, wake_in=limits.retry_wait(job, status, seen.now))
    lost = sorted({w.node for w in workers} & seen.lost_nodes)
    if lost:
        return _node_lost(seen, status, lost)
    if phase is Phase.RESTARTING:
        return _restarting(seen, status)
    return _starting_or_running(seen, status)


def _names(pods: Iterable[PodFacts]) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in pods))


def _current(pods: Sequence[PodFacts], status: HeteroTrainJobStatus) -> dict[str, PodFacts]:
    allocation = status.allocation
    if allocation is None:
        return {}
    return {p.name: p for p in pods if p.generation == allocation.generation}


def _stale(pods: Sequence[PodFacts], status: HeteroTrainJobStatus) -> list[PodFacts]:
    """Pods of earlier generations, finished ones too: a restart deletes its old generation after
    writing the new one, and an operator killed in between must not leave those pods for good."""
    generation = status.allocation.generation if status.allocation is not None else None
    return [p for p in pods if not p.deleting and p.generation != generation]


def _suspended(seen: Observation, status: HeteroTrainJobStatus) -> Step:
    leftovers = _names(p for p in seen.pods if p.live and not p.deleting)
    if seen.job.spec.suspend:
        return Step(status, delete_pods=leftovers)
    resumed = status.model_copy(update={"phase": Phase.QUEUED})
    resumed = set_condition(resumed, ConditionType.PLACED, False, "Resumed", "waiting to be placed", seen.now)
    return Step(
        resumed,
        delete_pods=leftovers,
        events=(JobEvent("Normal", "Resumed", "spec.suspend is false: queued"),),
    )


def _suspend(seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig) -> Step:
    """spec.suspend became true: a job holding GPUs drains first, a waiting one stops at once."""
    live = [p for p in seen.pods if p.live and not p.deleting]
    if status.phase in HOLDING_PHASES and live:
        message = "spec.suspend is true: the workers save a checkpoint, then stop"
        started = draining(seen.job, DrainReason.SUSPENDED, message, seen.now)
        return _drain(replace(seen, job=seen.job.model_copy(update={"status": started})), started, config)
    return _finish_drain(seen, status, DrainReason.SUSPENDED, live)


def _drain(seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig) -> Step:
    found = condition(status, ConditionType.DRAINING)
    assert found is not None
    reason = DrainReason(found.reason) if found.reason in set(DrainReason) else DrainReason.PREEMPTED
    live = [p for p in seen.pods if p.live and not p.deleting]
    on_lost = [p for p in live if p.node in seen.lost_nodes]
    waiting_for = [p for p in live if p.node not in seen.lost_nodes]
    deadline = found.last_transition_time.timestamp() + config.checkpoint_grace_seconds
    if waiting_for and seen.now < deadline:
        return Step(
            status,
            request_checkpoint=_names(p for p in waiting_for if not p.checkpoint_requested),
            force_delete_pods=_names(on_lost),
            wake_in=deadline - seen.now,
        )
    return _finish_drain(seen, status, reason, live)


def _finish_drain(
    seen: Observation, status: HeteroTrainJobStatus, reason: DrainReason, live: Sequence[PodFacts]
) -> Step:
    if reason is DrainReason.RESIZED and _resizing_in_place(status, seen.pods):
        resized = _finish_resize(seen, status, live)
        if resized is not None:
            return resized
    now = seen.now
    suspend = reason is DrainReason.SUSPENDED and seen.job.spec.suspend
    phase = Phase.SUSPENDED if suspend else Phase.QUEUED
    updated = status.model_copy(update={"phase": phase, "allocation": released(status.allocation)})
    updated = clear_condition(updated, ConditionType.DRAINING, "Stopped", "the workers stopped", now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, "Stopped", "no workers", now)
    if suspend:
        message = "suspended: workers stopped, checkpoint kept"
        updated = set_condition(updated, ConditionType.PLACED, False, "Suspended", message, now)
    else:
        message = (
            f"{reason.value.lower()}: workers stopped after their checkpoint; waiting to be placed again"
        )
        updated = set_condition(updated, ConditionType.PLACED, False, reason.value, message, now)
    on_lost = [p for p in live if p.node in seen.lost_nodes]
    return Step(
        updated,
        delete_pods=_names(p for p in live if p.node not in seen.lost_nodes),
        force_delete_pods=_names(on_lost),
        events=(JobEvent("Normal", phase.value if suspend else reason.value, message),),
    )


def _resizing_in_place(status: HeteroTrainJobStatus, pods: Sequence[PodFacts]) -> bool:
    """The job already holds its new GPUs: no pod of its current generation exists yet."""
    allocation = status.allocation
    return (
        allocation is not None
        and bool(allocation.workers)
        and not any(p.generation == allocation.generation for p in pods)
    )


def _finish_resize(seen: Observation, status: HeteroTrainJobStatus, live: Sequence[PodFacts]) -> Step | None:
    """The old workers saved their checkpoint: stop them and publish the plan for the new size. The
    new generation starts once they are gone (`_starting_or_running`). None: no plan fits the new
    size (the job goes back to the queue instead)."""
    allocation = status.allocation
    assert allocation is not None
    version = status.plan.version + 1 if status.plan is not None else 1
    predicted = allocation.predicted_samples_per_second
    iteration = seen.job.spec.batch.global_batch / predicted if predicted else None
    try:
        plan = initial_plan(seen.job.spec, allocation, seen.speeds, version, iteration)
    except PlanBuildError:
        return None
    now = seen.now
    message = f"resized: starting worker generation {allocation.generation} on {allocation.total_gpus} GPUs"
    updated = status.model_copy(update={"phase": Phase.STARTING, "plan": plan_status(plan)})
    updated = clear_condition(updated, ConditionType.DRAINING, "Stopped", "the old workers stopped", now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, "Resizing", message, now)
    updated = set_condition(updated, ConditionType.PLACED, True, "Placed", message, now)
    on_lost = [p for p in live if p.node in seen.lost_nodes]
    return Step(
        updated,
        publish_plan=plan,
        delete_pods=_names(p for p in live if p.node not in seen.lost_nodes),
        force_delete_pods=_names(on_lost),
        events=(JobEvent("Normal", DrainReason.RESIZED.value, message),),
    )


def _node_lost(seen: Observation, status: HeteroTrainJobStatus, lost: Sequence[str]) -> Step:
    now = seen.now
    message = f"node {', '.join(lost)} is gone or not Ready: the job is queued to be placed again"
    updated = status.model_copy(update={"phase": Phase.QUEUED, "allocation": released(status.allocation)})
    updated = set_condition(updated, ConditionType.PLACED, False, "NodeLost", message, now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, "NodeLost", message, now)
    live = [p for p in seen.pods if p.live]
    return Step(
        updated,
        delete_pods=_names(p for p in live if p.node not in seen.lost_nodes and not p.deleting),
        force_delete_pods=_names(p for p in live if p.node in seen.lost_nodes),
        events=(JobEvent("Warning", "NodeLost", message),),
    )


def _backoff(status: HeteroTrainJobStatus, job: HeteroTrainJob) -> float:
    return limits.backoff(status.restarts, job)


def _restarting(seen: Observation, status: HeteroTrainJobStatus) -> Step:
    live = [p for p in _current(seen.pods, status).values() if p.live]
    started = condition(status, ConditionType.RESTARTING)
    since = started.last_transition_time.timestamp() if started is not None else seen.now
    due = since + _backoff(status, seen.job)
    if live or seen.now < due:
        return Step(
            status,
            delete_pods=_names(p for p in live if not p.deleting),
            wake_in=max(due - seen.now, 0.5),
        )
    allocation = status.allocation
    assert allocation is not None
    fresh = Allocation.from_workers(allocation.workers, generation=allocation.generation + 1)
    updated = status.model_copy(update={"phase": Phase.STARTING, "allocation": fresh})
    restart = f"restart {status.restarts} of {seen.job.spec.restart_policy.max_restarts}"
    updated = clear_condition(updated, ConditionType.RESTARTING, "Restarted", f"{restart} began", seen.now)
    message = f"{restart}: starting worker generation {fresh.generation} from the last checkpoint"
    return Step(
        updated,
        ensure_generation=True,
        delete_pods=_names(p for p in seen.pods if p.generation == allocation.generation and not p.deleting),
        events=(JobEvent("Normal", "Restarting", message),),
    )


def _starting_or_running(seen: Observation, status: HeteroTrainJobStatus) -> Step:
    allocation = status.allocation
    assert allocation is not None
    now = seen.now
    stale = _names(_stale(seen.pods, status))
    current = _current(seen.pods, status)
    expected = [names.pod_name(seen.job.name, allocation.generation, w.rank) for w in allocation.workers]
    failed = [current[n] for n in expected if n in current and current[n].phase == "Failed"]
    missing = [n for n in expected if n not in current]
    fatal = limits.fatal_exit(seen, status, failed)
    if fatal is not None:
        return fatal
    if failed:
        pod = failed[0]
        return _failure(seen, status, f"worker pod {pod.name} failed with exit code {pod.exit_code}")
    if missing and status.phase is Phase.RUNNING:
        return _failure(seen, status, f"worker pod {missing[0]} disappeared")
    if missing and any(p.live for p in _stale(seen.pods, status)):
        # Old workers (a resize's) are still stopping: never start next to them.
        return Step(status, delete_pods=stale, wake_in=1.0)
    if missing:
        return Step(status, ensure_generation=True, delete_pods=stale)
    pods = [current[n] for n in expected]
    if all(p.phase == "Succeeded" for p in pods):
        message = f"all {len(pods)} workers finished"
        updated = status.model_copy(update={"phase": Phase.SUCCEEDED})
        updated = set_condition(updated, ConditionType.SUCCEEDED, True, "WorkersSucceeded", message, now)
        updated = set_condition(updated, ConditionType.PODS_READY, False, "Finished", message, now)
        return Step(updated, delete_pods=stale, events=(JobEvent("Normal", "Succeeded", message),))
    if status.phase is Phase.STARTING and all(p.phase in ("Running", "Succeeded") for p in pods):
        message = f"all {len(pods)} workers are running"
        updated = status.model_copy(update={"phase": Phase.RUNNING})
        updated = set_condition(updated, ConditionType.PODS_READY, True, "WorkersRunning", message, now)
        return Step(updated, delete_pods=stale, events=(JobEvent("Normal", "Running", message),))
    return Step(status, delete_pods=stale)


def _failure(seen: Observation, status: HeteroTrainJobStatus, what: str) -> Step:
    now = seen.now
    policy = seen.job.spec.restart_policy
    live = _names(p for p in seen.pods if p.live and not p.deleting)
    if status.restarts < policy.max_restarts:
        restarts = status.restarts + 1
        updated = status.model_copy(update={"phase": Phase.RESTARTING, "restarts": restarts})
        delay = _backoff(updated, seen.job)
        message = f"{what}; restart {restarts} of {policy.max_restarts} in {delay:g} s"
        updated = set_condition(updated, ConditionType.RESTARTING, True, "WorkerFailed", message, now)
        updated = set_condition(updated, ConditionType.PODS_READY, False, "WorkerFailed", message, now)
        return Step(
            updated,
            delete_pods=live,
            events=(JobEvent("Warning", "WorkerFailed", message),),
            wake_in=max(delay, 0.5),
            restarted=True,
        )
    message = f"{what}; no restarts left (restartPolicy.maxRestarts={policy.max_restarts})"
    updated = status.model_copy(update={"phase": Phase.FAILED})
    updated = set_condition(updated, ConditionType.FAILED, True, "RestartsExhausted", message, now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, "WorkerFailed", message, now)
    return Step(updated, delete_pods=live, events=(JobEvent("Warning", "Failed", message),))


# --- what the scheduler sees ---------------------------------------------------------------------


class Role(StrEnum):
    QUEUED = "queued"
    HOLDING = "holding"
    NONE = "none"


def scheduling_role(
    job: HeteroTrainJob, status: HeteroTrainJobStatus, pods: Sequence[PodFacts], now: float | None = None
) -> Role:
    """Queued jobs wait for a placement once all their old pods are gone (a new generation must not
    start next to workers still saving a checkpoint) and, given `now`, a start timeout's backoff has
    passed; jobs holding GPUs keep them in the snapshot."""
    if status.phase is Phase.QUEUED and not job.spec.suspend:
        backing_off = now is not None and limits.retry_wait(job, status, now) is not None
        return Role.NONE if backing_off or any(p.live for p in pods) else Role.QUEUED
    if status.phase in HOLDING_PHASES and status.allocation is not None and status.allocation.workers:
        return Role.HOLDING
    return Role.NONE
