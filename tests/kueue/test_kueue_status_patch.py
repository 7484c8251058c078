"""The status patches that hand an evicted admission back and mark a Workload finished."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from hetero_operator.kueue.admission import WorkloadPhase, read_admission
from hetero_operator.kueue.status_patch import StatusPatchError, mark_finished, release_after_eviction

NOW = dt.datetime(2026, 3, 1, 12, 0, 5, tzinfo=dt.UTC)
EARLIER = "2026-03-01T11:00:00Z"
ADMISSION = {
    "clusterQueue": "gpus",
    "podSetAssignments": [{"name": "fast", "flavors": {"nvidia.com/gpu": "a100"}, "count": 2}],
}


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": EARLIER,
    }


def evicted_workload(reason: str) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "w",
            "namespace": "team",
            "uid": "u-1",
            "resourceVersion": "42",
            "generation": 1,
        },
        "spec": {"podSets": [{"name": "fast", "count": 2}], "queueName": "q"},
        "status": {
            "admission": ADMISSION,
            "conditions": [
                condition("QuotaReserved", "True", "QuotaReserved"),
                condition("Admitted", "True", "Admitted"),
                condition("Evicted", "True", reason, "evicted because"),
                condition("SomethingElse", "True", "Other"),
            ],
            "schedulingStats": {"evictions": [{"reason": reason, "underlyingCause": "", "count": 1}]},
            "resourceRequests": [{"name": "fast", "resources": {"nvidia.com/gpu": "2"}}],
        },
    }


def conditions_of(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch["status"]["conditions"]}


@pytest.mark.parametrize(
    ("reason", "requeued"),
    [
        ("Preempted", "True"),
        ("NodeFailures", "True"),
        ("Deactivated", "False"),
        ("ClusterQueueStopped", "False"),
    ],
)
def test_release_drops_the_admission_and_unreserves(reason: str, requeued: str) -> None:
    patch = release_after_eviction(evicted_workload(reason), NOW)
    assert "admission" not in patch["status"]
    conditions = conditions_of(patch)
    assert conditions["QuotaReserved"]["status"] == "False"
    assert conditions["QuotaReserved"]["reason"] == "Pending"
    assert conditions["QuotaReserved"]["message"] == "evicted because"
    assert conditions["QuotaReserved"]["lastTransitionTime"] == "2026-03-01T12:00:05Z"
    assert (conditions["Admitted"]["status"], conditions["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == (requeued, reason)
    # Evicted did not change: its transition time stays; conditions Kueue's admission does not own stay out
    assert conditions["Evicted"]["lastTransitionTime"] == EARLIER
    assert "SomethingElse" not in conditions


def test_release_keeps_the_fields_the_admission_manager_owns() -> None:
    original = evicted_workload("Preempted")
    patch = release_after_eviction(original, NOW)
    assert patch["status"]["schedulingStats"] == original["status"]["schedulingStats"]
    assert patch["status"]["resourceRequests"] == original["status"]["resourceRequests"]
    assert patch["metadata"] == {"name": "w", "namespace": "team", "uid": "u-1", "resourceVersion": "42"}
    assert (patch["apiVersion"], patch["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
    # building the patch leaves the object read untouched
    assert original["status"]["admission"] == ADMISSION
    assert original["status"]["conditions"][0]["status"] == "True"


def test_the_released_workload_reads_as_pending() -> None:
    original = evicted_workload("Preempted")
    released = {**original, "status": release_after_eviction(original, NOW)["status"]}
    assert read_admission(released).phase is WorkloadPhase.PENDING


def test_release_refuses_a_workload_that_is_not_evicted() -> None:
    workload = evicted_workload("Preempted")
    workload["status"]["conditions"] = [c for c in workload["status"]["conditions"] if c["type"] != "Evicted"]
    with pytest.raises(StatusPatchError, match="not evicted"):
        release_after_eviction(workload, NOW)


@pytest.mark.parametrize(("succeeded", "reason"), [(True, "Succeeded"), (False, "Failed")])
def test_finish_sets_finished_and_keeps_the_admission(succeeded: bool, reason: str) -> None:
    workload = evicted_workload("Preempted")
    workload["status"]["conditions"] = workload["status"]["conditions"][:2]
    patch = mark_finished(workload, succeeded, "training done", NOW)
    finished = conditions_of(patch)["Finished"]
    assert (finished["status"], finished["reason"], finished["message"]) == ("True", reason, "training done")
    assert finished["observedGeneration"] == 1
    assert patch["status"]["admission"] == ADMISSION
    assert read_admission({**workload, "status": patch["status"]}).phase is WorkloadPhase.FINISHED
