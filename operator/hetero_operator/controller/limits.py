"""A job's time limits and its failures that no restart can fix, as pure functions of the observed
job, its pods and the time.

- spec.startTimeoutSeconds (default: the operator's): a worker pod not Running that long after its
  start's pods were created stops the start. The pods are deleted, the GPUs released and the job
  queued again once the restart backoff has passed (counting a restart), so the scheduler may pick
  other nodes; Failed once restartPolicy.maxRestarts is used up.
- spec.activeDeadlineSeconds, from status.startedAt (the first placement): Failed, DeadlineExceeded.
- spec.ttlSecondsAfterFinished, from status.finishedAt: the job object is deleted.
- restartPolicy.nonRetryableExitCodes: a worker ending with one fails the job at once.
- A worker ending with DIVERGED_EXIT_CODE (its ranks' replicas diverged, or its loss or parameters
  became non-finite) fails the job at once, reason Diverged, with the worker's termination message:
  a restart from the last checkpoint would run into the same failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime

from hetero_operator.controller.facts import PodFacts
from hetero_operator.controller.job_conditions import ConditionType, condition, is_true, set_condition
from hetero_operator.controller.lifecycle_step import JobEvent, LifecycleConfig, Observation, Step
from hetero_operator.controller.transitions import HOLDING_PHASES, TERMINAL_PHASES, released
from hetero_operator.plan import DIVERGED_EXIT_CODE
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus, Phase

START_TIMEOUT = "StartTimeout"
DEADLINE_EXCEEDED = "DeadlineExceeded"
NON_RETRYABLE_EXIT_CODE = "NonRetryableExitCode"
DIVERGED = "Diverged"
SOONEST_WAKE = 0.5


def _seconds(moment: datetime | None) -> float | None:
    return moment.timestamp() if moment is not None else None


def _at(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC)


def backoff(restarts: int, job: HeteroTrainJob) -> float:
    """The wait before restart number `restarts`: restartPolicy.backoffSeconds, doubling each time."""
    return float(job.spec.restart_policy.backoff_seconds * 2 ** max(restarts - 1, 0))


# --- what ends or stops a job before the lifecycle looks at its pods -----------------------------


def over_limit(seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig) -> Step | None:
    """The step of a job past its active deadline or its start timeout; None when neither is."""
    if status.phase in TERMINAL_PHASES:
        return None
    deadline = _deadline(seen.job, status)
    if deadline is not None and seen.now >= deadline:
        limit = seen.job.spec.active_deadline_seconds
        message = f"the job ran past spec.activeDeadlineSeconds={limit} (counted from status.startedAt)"
        return failed(seen, status, DEADLINE_EXCEEDED, message)
    stuck = _not_started(seen, status, config)
    if stuck is None:
        return None
    pod, waited = stuck
    reason = pod.waiting_reason or pod.phase
    detail = f" ({pod.waiting_message})" if pod.waiting_message else ""
    return _start_timed_out(
        seen, status, f"worker pod {pod.name} not Running after {waited:g} s: {reason}{detail}"
    )


def failed(seen: Observation, status: HeteroTrainJobStatus, reason: str, message: str) -> Step:
    """Failed at once, whatever restarts are left: every worker is deleted and the GPUs released."""
    now = seen.now
    updated = status.model_copy(update={"phase": Phase.FAILED, "allocation": released(status.allocation)})
    updated = set_condition(updated, ConditionType.FAILED, True, reason, message, now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, reason, message, now)
    live = [p for p in seen.pods if p.live]
    return Step(
        updated,
        delete_pods=_names(p for p in live if p.node not in seen.lost_nodes and not p.deleting),
        force_delete_pods=_names(p for p in live if p.node in seen.lost_nodes),
        events=(JobEvent("Warning", reason, message),),
    )


def fatal_exit(
    seen: Observation, status: HeteroTrainJobStatus, failed_pods: Sequence[PodFacts]
) -> Step | None:
    """Failed at once when a failed worker diverged, or its exit code is one of
    restartPolicy.nonRetryableExitCodes."""
    diverged = next((p for p in failed_pods if p.exit_code == DIVERGED_EXIT_CODE), None)
    if diverged is not None:
        said = diverged.termination_message or "its replicas diverged or its numbers became non-finite"
        message = (
            f"worker pod {diverged.name} stopped training: {said.removeprefix('Diverged: ')}; not restarted"
        )
        return failed(seen, status, DIVERGED, message)
    codes = set(seen.job.spec.restart_policy.non_retryable_exit_codes)
    pod = next((p for p in failed_pods if p.exit_code in codes), None)
    if pod is None:
        return None
    message = (
        f"worker pod {pod.name} exited with code {pod.exit_code}, "
        "listed in restartPolicy.nonRetryableExitCodes: not restarted"
    )
    return failed(seen, status, NON_RETRYABLE_EXIT_CODE, message)


def _names(pods: Iterable[PodFacts]) -> tuple[str, ...]:
    return tuple(sorted(p.name for p in pods))


def _deadline(job: HeteroTrainJob, status: HeteroTrainJobStatus) -> float | None:
    started = _seconds(status.started_at)
    limit = job.spec.active_deadline_seconds
    return None if started is None or limit is None else started + limit


def _start_timeout(job: HeteroTrainJob, config: LifecycleConfig) -> float | None:
    limit = job.spec.start_timeout_seconds
    chosen = float(limit) if limit is not None else config.start_timeout_seconds
    return chosen or None


def _starting_pods(seen: Observation, status: HeteroTrainJobStatus) -> list[PodFacts]:
    """The current generation's pods of a job that is starting them (not draining, suspending or
    losing a node, whose own steps come first), or none."""
    allocation = status.allocation
    if (
        status.phase is not Phase.STARTING
        or allocation is None
        or not allocation.workers
        or seen.job.spec.suspend
        or is_true(status, ConditionType.DRAINING)
        or {w.node for w in allocation.workers} & seen.lost_nodes
    ):
        return []
    return sorted((p for p in seen.pods if p.generation == allocation.generation), key=lambda p: p.rank or 0)


def _start_due(seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig) -> float | None:
    """When the current start times out, counted from its first pod's creation."""
    timeout = _start_timeout(seen.job, config)
    created = [p.created_at for p in _starting_pods(seen, status) if p.created_at is not None]
    return min(created) + timeout if timeout is not None and created else None


def _not_started(
    seen: Observation, status: HeteroTrainJobStatus, config: LifecycleConfig
) -> tuple[PodFacts, float] | None:
    """A worker still Pending at the start timeout (one whose container says why it waits, if any),
    and the seconds its start has taken. A failed worker is left to the restart policy."""
    due = _start_due(seen, status, config)
    pods = _starting_pods(seen, status)
    if due is None or seen.now < due or any(p.phase == "Failed" for p in pods):
        return None
    pending = [p for p in pods if p.phase == "Pending" and not p.deleting]
    if not pending:
        return None
    pending.sort(key=lambda p: p.waiting_reason is None)  # one that says why first
    timeout = _start_timeout(seen.job, config) or 0.0
    return pending[0], round(seen.now - due + timeout)


def _start_timed_out(seen: Observation, status: HeteroTrainJobStatus, what: str) -> Step:
    """Release the GPUs and queue the job again after the backoff, or fail it with no restarts left."""
    policy = seen.job.spec.restart_policy
    if status.restarts >= policy.max_restarts:
        message = f"{what}; no restarts left (restartPolicy.maxRestarts={policy.max_restarts})"
        return failed(seen, status, START_TIMEOUT, message)
    now = seen.now
    restarts = status.restarts + 1
    delay = backoff(restarts, seen.job)
    message = (
        f"{what}; the GPUs are released and the job is placed again in {delay:g} s "
        f"(restart {restarts} of {policy.max_restarts})"
    )
    updated = status.model_copy(
        update={"phase": Phase.QUEUED, "allocation": released(status.allocation), "restarts": restarts}
    )
    updated = set_condition(updated, ConditionType.PLACED, False, START_TIMEOUT, message, now)
    updated = set_condition(updated, ConditionType.PODS_READY, False, START_TIMEOUT, message, now)
    return Step(
        updated,
        delete_pods=_names(p for p in seen.pods if p.live and not p.deleting),
        events=(JobEvent("Warning", START_TIMEOUT, message),),
        wake_in=max(delay, SOONEST_WAKE),
        restarted=True,
    )


def retry_wait(job: HeteroTrainJob, status: HeteroTrainJobStatus, now: float) -> float | None:
    """Seconds a job queued again after a start timeout still waits out its backoff; None if none."""
    found = condition(status, ConditionType.PLACED)
    if status.phase is not Phase.QUEUED or found is None or found.reason != START_TIMEOUT:
        return None
    left = found.last_transition_time.timestamp() + backoff(status.restarts, job) - now
    return left if left > 0 else None


# --- after the lifecycle: the times it records and the wakes and deletion they lead to ------------


def with_times(step: Step, seen: Observation, config: LifecycleConfig) -> Step:
    """Record the first start and the finish, delete a finished job whose TTL has passed, and wake
    the loop when the next limit falls due."""
    status, now = step.status, seen.now
    if status.phase in HOLDING_PHASES and status.started_at is None:
        status = status.model_copy(update={"started_at": _at(now)})
    if status.phase in TERMINAL_PHASES and status.finished_at is None:
        status = status.model_copy(update={"finished_at": _at(now)})
    ttl = seen.job.spec.ttl_seconds_after_finished
    finished = _seconds(status.finished_at)
    expire = finished + ttl if ttl is not None and finished is not None else None
    if status.phase in TERMINAL_PHASES:
        dues = [expire]
    else:
        dues = [_deadline(seen.job, status), _start_due(seen, status, config)]
    wakes = [step.wake_in] + [max(due - now, SOONEST_WAKE) for due in dues if due is not None and due > now]
    wake = min((w for w in wakes if w is not None), default=None)
    delete = status.phase in TERMINAL_PHASES and expire is not None and now >= expire
    return replace(step, status=status, wake_in=wake, delete_job=step.delete_job or delete)
