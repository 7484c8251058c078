"""Reading Kueue's decision from a Workload, on objects shaped as Kueue v0.19.2 writes them."""

from __future__ import annotations

from typing import Any

import pytest

from hetero_operator.kueue.admission import (
    PodSetAdmission,
    WorkloadPhase,
    WorkloadReadError,
    read_admission,
)

PREEMPTED_MESSAGE = "Preempted to accommodate a workload due to prioritization in the ClusterQueue"


def condition(kind: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def workload(
    conditions: list[dict[str, Any]] | None = None,
    admission: dict[str, Any] | None = None,
    active: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": conditions or []}
    if admission is not None:
        status["admission"] = admission
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "train-1a2b3c4d", "namespace": "team"},
        "spec": {
            "queueName": "team-queue",
            "active": active,
            "podSets": [{"name": "fast", "count": 3}, {"name": "slow", "count": 2}],
        },
        "status": status,
    }


ADMISSION = {
    "clusterQueue": "gpus",
    "podSetAssignments": [
        {"name": "fast", "flavors": {"nvidia.com/gpu": "a100"}, "count": 3},
        {"name": "slow", "flavors": {"nvidia.com/gpu": "t4"}, "count": 2},
    ],
}
RESERVED = condition("QuotaReserved", True, "QuotaReserved", "Quota reserved in ClusterQueue gpus")
ADMITTED = condition("Admitted", True, "Admitted", "The workload is admitted")


def test_a_new_workload_is_pending() -> None:
    read = read_admission(workload())
    assert read.phase is WorkloadPhase.PENDING
    assert read.pod_sets == ()
    assert read.cluster_queue is None
    assert read.queue_name == "team-queue"
    assert read.name == "train-1a2b3c4d"


def test_waiting_for_quota_keeps_kueues_reason_and_message() -> None:
    message = "insufficient unused quota for nvidia.com/gpu in flavor a100, 1 more needed"
    read = read_admission(workload([condition("QuotaReserved", False, "Pending", message)]))
    assert read.phase is WorkloadPhase.PENDING
    assert (read.waiting_reason, read.waiting_message) == ("Pending", message)


def test_admitted_gives_each_pod_sets_flavor_and_count() -> None:
    read = read_admission(workload([RESERVED, ADMITTED], ADMISSION))
    assert read.phase is WorkloadPhase.ADMITTED
    assert read.cluster_queue == "gpus"
    assert read.pod_sets == (
        PodSetAdmission("fast", {"nvidia.com/gpu": "a100"}, 3),
        PodSetAdmission("slow", {"nvidia.com/gpu": "t4"}, 2),
    )
    assert read.counts_by_flavor("nvidia.com/gpu") == {"a100": 3, "t4": 2}
    assert read.counts_by_flavor("example.com/other") == {}
    assert read.waiting_reason is None


def test_an_assignment_without_count_is_the_whole_pod_set() -> None:
    admission = {
        "clusterQueue": "gpus",
        "podSetAssignments": [
            {"name": "fast", "flavors": {"nvidia.com/gpu": "a100"}},
            {"name": "slow", "flavors": {"nvidia.com/gpu": "t4"}, "count": 1},
        ],
    }
    read = read_admission(workload([RESERVED, ADMITTED], admission))
    assert [(p.name, p.count) for p in read.pod_sets] == [("fast", 3), ("slow", 1)]


def test_reserved_but_not_yet_admitted_waits_for_admission_checks() -> None:
    not_admitted = condition("Admitted", False, "UnsatisfiedChecks")
    read = read_admission(workload([RESERVED, not_admitted], ADMISSION))
    assert read.phase is WorkloadPhase.QUOTA_RESERVED
    assert read.admitted is False


def test_preempted_while_reserved_must_be_released_and_requeues() -> None:
    conditions = [
        RESERVED,
        ADMITTED,
        condition("Evicted", True, "Preempted", PREEMPTED_MESSAGE),
        condition("Preempted", True, "InClusterQueue", PREEMPTED_MESSAGE),
    ]
    read = read_admission(workload(conditions, ADMISSION))
    assert read.phase is WorkloadPhase.EVICTED
    assert read.eviction is not None
    assert (read.eviction.reason, read.eviction.preemption_reason) == ("Preempted", "InClusterQueue")
    assert read.eviction.requeues is True
    # the workers still hold what was admitted until they are stopped
    assert read.counts_by_flavor("nvidia.com/gpu") == {"a100": 3, "t4": 2}


def test_released_after_preemption_is_pending_again() -> None:
    conditions = [
        condition("QuotaReserved", False, "Pending", "insufficient unused quota"),
        condition("Evicted", True, "Preempted", PREEMPTED_MESSAGE),
        condition("Admitted", False, "NoReservation"),
        condition("Requeued", True, "Preempted", PREEMPTED_MESSAGE),
    ]
    read = read_admission(workload(conditions))
    assert read.phase is WorkloadPhase.PENDING
    assert read.pod_sets == ()


def test_deactivated_and_released_is_inactive_and_does_not_requeue() -> None:
    evicted = condition("Evicted", True, "Deactivated", "The workload is deactivated")
    reserved = read_admission(workload([RESERVED, ADMITTED, evicted], ADMISSION, active=False))
    assert reserved.phase is WorkloadPhase.EVICTED
    assert reserved.eviction is not None and reserved.eviction.requeues is False
    released = workload([condition("QuotaReserved", False, "Pending"), evicted], active=False)
    assert read_admission(released).phase is WorkloadPhase.INACTIVE


@pytest.mark.parametrize(("reason", "succeeded"), [("Succeeded", True), ("Failed", False)])
def test_finished_wins_over_everything(reason: str, succeeded: bool) -> None:
    finished = condition("Finished", True, reason, "done")
    read = read_admission(workload([RESERVED, ADMITTED, finished], ADMISSION))
    assert read.phase is WorkloadPhase.FINISHED
    assert read.finish is not None and read.finish.succeeded is succeeded


def test_admission_without_quota_reserved_true_is_not_counted() -> None:
    read = read_admission(workload([condition("QuotaReserved", False, "Pending")], ADMISSION))
    assert read.quota_reserved is False
    assert read.pod_sets == ()


def test_an_assignment_for_an_unknown_pod_set_is_an_error() -> None:
    admission = {"clusterQueue": "gpus", "podSetAssignments": [{"name": "medium", "count": 1}]}
    with pytest.raises(WorkloadReadError, match="pod set 'medium'"):
        read_admission(workload([RESERVED, ADMITTED], admission))


def test_a_workload_without_pod_sets_is_an_error_naming_the_field() -> None:
    with pytest.raises(WorkloadReadError, match=r"spec\.podSets"):
        read_admission({"metadata": {"name": "x"}, "spec": {"podSets": []}})
