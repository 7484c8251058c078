"""Time limits and non-retryable exit codes in the pure lifecycle, with an explicit clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.operator.builders import allocation, job, pod

from hetero_operator.controller.facts import PodFacts
from hetero_operator.controller.job_conditions import ConditionType, condition
from hetero_operator.controller.lifecycle import (
    LifecycleConfig,
    Observation,
    Role,
    Step,
    reconcile,
    scheduling_role,
)
from hetero_operator.controller.transitions import queued
from hetero_operator.resources import HeteroTrainJobStatus, Phase

NOW = 1_800_000_000.0
CONFIG = LifecycleConfig(checkpoint_grace_seconds=30, start_timeout_seconds=600)
CREATED = NOW - 1000  # when the current generation's pods were created


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def status_in(phase: Phase, restarts: int = 0, **times: datetime) -> HeteroTrainJobStatus:
    status = queued(job(), CREATED - 100)
    return status.model_copy(
        update={
            "phase": phase,
            "allocation": allocation(("node-a", "fast"), ("node-b", "slow")),
            "restarts": restarts,
            **times,
        }
    )


def starting_pods(second: PodFacts | None = None) -> list[PodFacts]:
    first = pod("train-g0-w0", "Running", node="node-a", rank=0, created_at=CREATED)
    stuck = pod(
        "train-g0-w1",
        "Pending",
        node="node-b",
        rank=1,
        created_at=CREATED,
        waiting_reason="ErrImagePull",
        waiting_message='pull access denied for "no/such:image"',
    )
    return [first, second or stuck]


def step_at(status: HeteroTrainJobStatus, pods: list[PodFacts], now: float, **spec: Any) -> Step:
    return reconcile(Observation(job(status, **spec), tuple(pods), frozenset(), now), CONFIG)


# --- start timeout ---------------------------------------------------------------------------------


def test_a_pod_not_running_at_the_start_timeout_releases_the_gpus_and_queues_the_job_again() -> None:
    spec = {"startTimeoutSeconds": 300, "restartPolicy": {"maxRestarts": 2, "backoffSeconds": 20}}
    before = step_at(status_in(Phase.STARTING), starting_pods(), CREATED + 299, **spec)
    assert before.status.phase is Phase.STARTING and not before.delete_pods
    assert before.wake_in == 1  # woken when the timeout falls due

    step = step_at(status_in(Phase.STARTING), starting_pods(), CREATED + 300, **spec)
    assert step.status.phase is Phase.QUEUED and step.status.restarts == 1 and step.restarted
    assert step.status.allocation is not None and step.status.allocation.workers == []
    assert step.delete_pods == ("train-g0-w0", "train-g0-w1")
    placed = condition(step.status, ConditionType.PLACED)
    assert placed is not None and placed.reason == "StartTimeout"
    assert placed.message.startswith(
        "worker pod train-g0-w1 not Running after 300 s: "
        'ErrImagePull (pull access denied for "no/such:image")'
    )
    assert "placed again in 20 s (restart 1 of 2)" in placed.message
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "StartTimeout")]
    assert step.wake_in == 20


def test_the_operator_default_applies_when_the_spec_sets_no_start_timeout() -> None:
    assert step_at(status_in(Phase.STARTING), starting_pods(), CREATED + 599).status.phase is Phase.STARTING
    assert step_at(status_in(Phase.STARTING), starting_pods(), CREATED + 600).status.phase is Phase.QUEUED


def test_a_job_queued_after_a_start_timeout_waits_out_its_backoff_before_it_is_placed() -> None:
    spec = {"startTimeoutSeconds": 300, "restartPolicy": {"backoffSeconds": 20}}
    timed_out = step_at(status_in(Phase.STARTING), starting_pods(), CREATED + 300, **spec).status
    later = job(timed_out, **spec)
    assert scheduling_role(later, timed_out, [], CREATED + 310) is Role.NONE
    assert reconcile(Observation(later, (), frozenset(), CREATED + 310), CONFIG).wake_in == 10
    assert scheduling_role(later, timed_out, [], CREATED + 320) is Role.QUEUED


def test_the_start_timeout_fails_the_job_once_restarts_are_used_up() -> None:
    spec = {"startTimeoutSeconds": 300, "restartPolicy": {"maxRestarts": 2}}
    step = step_at(status_in(Phase.STARTING, restarts=2), starting_pods(), CREATED + 300, **spec)
    assert step.status.phase is Phase.FAILED and step.status.restarts == 2
    failed = condition(step.status, ConditionType.FAILED)
    assert failed is not None and failed.reason == "StartTimeout"
    assert "train-g0-w1" in failed.message and "ErrImagePull" in failed.message
    assert "no restarts left (restartPolicy.maxRestarts=2)" in failed.message
    assert step.status.finished_at == at(CREATED + 300)


def test_running_workers_and_a_job_without_a_limit_never_time_out() -> None:
    running = pod("train-g0-w1", "Running", node="node-b", rank=1, created_at=CREATED)
    assert step_at(status_in(Phase.STARTING), starting_pods(running), NOW).status.phase is Phase.RUNNING
    no_limit = LifecycleConfig(start_timeout_seconds=0)
    seen = Observation(job(status_in(Phase.STARTING)), tuple(starting_pods()), frozenset(), NOW + 10**6)
    assert reconcile(seen, no_limit).status.phase is Phase.STARTING


# --- active deadline -------------------------------------------------------------------------------


def test_the_active_deadline_counts_from_the_first_start_and_fails_the_job() -> None:
    started = status_in(Phase.RUNNING, started_at=at(NOW - 3600))
    pods = [pod("train-g0-w0", node="node-a", rank=0), pod("train-g0-w1", node="node-b", rank=1)]
    before = step_at(started, pods, NOW - 1, activeDeadlineSeconds=3600)
    assert before.status.phase is Phase.RUNNING and before.wake_in == 1

    step = step_at(started, pods, NOW, activeDeadlineSeconds=3600)
    assert step.status.phase is Phase.FAILED
    failed = condition(step.status, ConditionType.FAILED)
    assert failed is not None and failed.reason == "DeadlineExceeded"
    assert "spec.activeDeadlineSeconds=3600" in failed.message
    assert step.delete_pods == ("train-g0-w0", "train-g0-w1")
    assert step.status.allocation is not None and step.status.allocation.workers == []
    assert step.status.finished_at == at(NOW)


def test_the_active_deadline_also_ends_a_job_queued_again_after_it_started() -> None:
    requeued = status_in(Phase.QUEUED, started_at=at(NOW - 100)).model_copy(update={"allocation": None})
    step = step_at(requeued, [], NOW, activeDeadlineSeconds=100)
    assert step.status.phase is Phase.FAILED


def test_the_first_start_is_recorded_once() -> None:
    step = step_at(status_in(Phase.STARTING), [], NOW)
    assert step.status.started_at == at(NOW)
    again = step_at(step.status, [], NOW + 50)
    assert again.status.started_at == at(NOW)


# --- ttl after finished ----------------------------------------------------------------------------


def test_a_finished_job_is_deleted_its_ttl_after_it_finished() -> None:
    succeeded = [
        pod("train-g0-w0", "Succeeded", node="node-a", rank=0),
        pod("train-g0-w1", "Succeeded", node="node-b", rank=1),
    ]
    done = step_at(status_in(Phase.RUNNING), succeeded, NOW, ttlSecondsAfterFinished=60)
    assert done.status.phase is Phase.SUCCEEDED and done.status.finished_at == at(NOW)
    assert not done.delete_job and done.wake_in == 60

    assert not step_at(done.status, succeeded, NOW + 59, ttlSecondsAfterFinished=60).delete_job
    assert step_at(done.status, succeeded, NOW + 60, ttlSecondsAfterFinished=60).delete_job
    assert not step_at(done.status, succeeded, NOW + 10**6).delete_job  # no TTL: kept


# --- exit codes that mean "do not retry" -----------------------------------------------------------


def test_a_non_retryable_exit_code_fails_the_job_at_once() -> None:
    pods = [
        pod("train-g0-w0", "Failed", node="node-a", rank=0, exit_code=1),
        pod("train-g0-w1", "Failed", node="node-b", rank=1, exit_code=42),
    ]
    spec = {"restartPolicy": {"maxRestarts": 5, "nonRetryableExitCodes": [42, 43]}}
    step = step_at(status_in(Phase.RUNNING), pods, NOW, **spec)
    assert step.status.phase is Phase.FAILED and step.status.restarts == 0 and not step.restarted
    failed = condition(step.status, ConditionType.FAILED)
    assert failed is not None and failed.reason == "NonRetryableExitCode"
    assert failed.message.startswith("worker pod train-g0-w1 exited with code 42")


def test_a_worker_that_diverged_fails_the_job_with_its_message_and_no_restart() -> None:
    """The runtime's divergence guard ends every rank with DIVERGED_EXIT_CODE and says why in the
    termination message; the job fails at once (a restart would diverge again), whatever restarts are
    left and whether or not the code is listed, even when another rank's pod failed first."""
    said = "Diverged: the parameters of rank 1 differ from rank 0's after step 1 (epoch 0)"
    pods = [
        pod("train-g0-w0", "Failed", node="node-a", rank=0, exit_code=1),
        pod("train-g0-w1", "Failed", node="node-b", rank=1, exit_code=86, termination_message=said),
        pod("train-g0-w2", "Running", node="node-b", rank=2),
    ]
    step = step_at(status_in(Phase.RUNNING), pods, NOW, restartPolicy={"maxRestarts": 5})
    assert step.status.phase is Phase.FAILED and step.status.restarts == 0 and not step.restarted
    failed = condition(step.status, ConditionType.FAILED)
    assert failed is not None and failed.reason == "Diverged"
    assert failed.message == (
        "worker pod train-g0-w1 stopped training: the parameters of rank 1 differ from rank 0's after "
        "step 1 (epoch 0); not restarted"
    )
    assert [(e.type, e.reason) for e in step.events] == [("Warning", "Diverged")]
    assert step.delete_pods == ("train-g0-w2",)


def test_pod_facts_keep_the_termination_message() -> None:
    terminated = {"exitCode": 86, "reason": "Error", "message": "Diverged: non-finite loss nan at step 7\n"}
    body = {
        "metadata": {"name": "train-g0-w1", "namespace": "team"},
        "status": {
            "phase": "Failed",
            "containerStatuses": [{"name": "w", "state": {"terminated": terminated}}],
        },
    }
    facts = PodFacts.from_body(body)
    assert (facts.exit_code, facts.termination_message) == (86, "Diverged: non-finite loss nan at step 7")


def test_other_exit_codes_still_restart() -> None:
    pods = [
        pod("train-g0-w0", node="node-a", rank=0),
        pod("train-g0-w1", "Failed", node="node-b", rank=1, exit_code=1),
    ]
    spec = {"restartPolicy": {"maxRestarts": 5, "nonRetryableExitCodes": [42]}}
    step = step_at(status_in(Phase.RUNNING), pods, NOW, **spec)
    assert step.status.phase is Phase.RESTARTING and step.status.restarts == 1


def test_pod_facts_keep_the_creation_time_and_why_a_container_waits() -> None:
    body = {
        "metadata": {"name": "train-g0-w1", "namespace": "team", "creationTimestamp": "2027-01-15T08:00:00Z"},
        "spec": {"nodeName": "node-b"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "worker",
                    "state": {
                        "waiting": {"reason": "CreateContainerConfigError", "message": 'secret "s" not found'}
                    },
                }
            ],
        },
    }
    facts = PodFacts.from_body(body)
    assert facts.created_at == datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp()
    assert (facts.waiting_reason, facts.waiting_message) == (
        "CreateContainerConfigError",
        'secret "s" not found',
    )
    unscheduled = {
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        }
    }
    assert PodFacts.from_body(unscheduled).waiting_reason == "Unschedulable"
