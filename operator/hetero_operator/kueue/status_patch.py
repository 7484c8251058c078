"""The Workload status patches a job integration owes Kueue: hand an evicted admission back, finish.

Kueue writes a Workload's admission with server-side apply as field manager `kueue-admission`,
forced; its own job integrations answer with the same manager. Each patch here is the full set of
fields that manager owns, changed as Kueue's integrations change them: apply it with
`fieldManager=kueue-admission` and `force=true`. Its resourceVersion makes a stale patch fail with
409 Conflict instead of undoing something Kueue did meanwhile: read again and rebuild.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from hetero_operator.kueue.admission import WorkloadPhase, WorkloadReadError, read_admission
from hetero_operator.kueue.constants import (
    ADMISSION_CONDITIONS,
    API_VERSION,
    REQUEUED_EVICTIONS,
    Condition,
    FinishReason,
)

Manifest = dict[str, Any]

# Status fields Kueue's admission patches carry besides `admission` and the conditions; a patch
# that left one out would delete it.
_CARRIED_STATUS_FIELDS = (
    "requeueState",
    "resourceRequests",
    "accumulatedPastExecutionTimeSeconds",
    "schedulingStats",
    "clusterName",
    "nominatedClusterNames",
    "unhealthyNodes",
    "preemptionGates",
    "admissionChecks",
)
_MAX_MESSAGE = 32768  # metav1.Condition's limit


class StatusPatchError(ValueError):
    """The Workload is not in a state the patch applies to; the message says which."""


def _timestamp(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Manifest],
    kind: Condition,
    status: bool,
    reason: str,
    message: str,
    now: dt.datetime,
    generation: int | None = None,
) -> None:
    """Set one condition in place; its lastTransitionTime moves only when its status changes."""
    wanted: Manifest = {
        "type": str(kind),
        "status": "True" if status else "False",
        "reason": str(reason),
        "message": message[:_MAX_MESSAGE],
        "lastTransitionTime": _timestamp(now),
    }
    if generation is not None:
        wanted["observedGeneration"] = generation
    for index, existing in enumerate(conditions):
        if existing.get("type") == kind:
            if existing.get("status") == wanted["status"]:
                wanted["lastTransitionTime"] = existing.get(
                    "lastTransitionTime", wanted["lastTransitionTime"]
                )
            conditions[index] = wanted
            return
    conditions.append(wanted)


def _condition(workload: Mapping[str, Any], kind: Condition) -> Mapping[str, Any] | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return condition
    return None


def _admission_patch(workload: Mapping[str, Any], keep_admission: bool) -> tuple[Manifest, list[Manifest]]:
    """The fields `kueue-admission` owns, copied from `workload`; returns the patch and its
    (mutable) condition list."""
    metadata = workload.get("metadata") or {}
    status = workload.get("status") or {}
    conditions = [
        copy.deepcopy(c) for c in status.get("conditions") or [] if c.get("type") in ADMISSION_CONDITIONS
    ]
    patch_status: Manifest = {"conditions": conditions}
    for key in _CARRIED_STATUS_FIELDS:
        if key in status:
            patch_status[key] = copy.deepcopy(status[key])
    if keep_admission and status.get("admission") is not None:
        patch_status["admission"] = copy.deepcopy(status["admission"])
    patch: Manifest = {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": metadata.get("name"),
            "namespace": metadata.get("namespace"),
            "uid": metadata.get("uid"),
            "resourceVersion": metadata.get("resourceVersion"),
        },
        "status": patch_status,
    }
    return patch, conditions


def release_after_eviction(workload: Mapping[str, Any], now: dt.datetime) -> Manifest:
    """Hand an evicted Workload's quota back, once none of its workers runs any more.

    Drops `status.admission`, sets QuotaReserved=False and Admitted=False, and Requeued=True after a
    preemption or node failures (the Workload queues again at once) or Requeued=False otherwise (a
    deactivated Workload waits for spec.active, one in a stopped queue for the queue)."""
    evicted = _condition(workload, Condition.EVICTED)
    if evicted is None or evicted.get("status") != "True":
        raise StatusPatchError("the Workload is not evicted (no Evicted=True condition): nothing to release")
    reason, message = str(evicted.get("reason", "")), str(evicted.get("message", ""))
    generation = (workload.get("metadata") or {}).get("generation")
    patch, conditions = _admission_patch(workload, keep_admission=False)
    set_condition(
        conditions, Condition.REQUEUED, reason in REQUEUED_EVICTIONS, reason, message, now, generation
    )
    set_condition(conditions, Condition.QUOTA_RESERVED, False, "Pending", message, now, generation)
    set_condition(
        conditions,
        Condition.ADMITTED,
        False,
        "NoReservation",
        "The workload has no reservation",
        now,
        generation,
    )
    return patch


def mark_finished(workload: Mapping[str, Any], succeeded: bool, message: str, now: dt.datetime) -> Manifest:
    """Mark the Workload Finished (Succeeded or Failed): Kueue releases its quota at once."""
    generation = (workload.get("metadata") or {}).get("generation")
    patch, conditions = _admission_patch(workload, keep_admission=True)
    reason = FinishReason.SUCCEEDED if succeeded else FinishReason.FAILED
    set_condition(conditions, Condition.FINISHED, True, reason, message, now, generation)
    return patch


def mark_pods_ready(workload: Mapping[str, Any], now: dt.datetime) -> Manifest:
    """PodsReady=True: every worker of the admitted job runs (what Kueue's waitForPodsReady waits for
    before its timeout evicts the Workload)."""
    generation = (workload.get("metadata") or {}).get("generation")
    patch, conditions = _admission_patch(workload, keep_admission=True)
    message = "All pods reached readiness and the workload is running"
    set_condition(conditions, Condition.PODS_READY, True, "PodsReady", message, now, generation)
    return patch


class WorkloadChange(StrEnum):
    """The status changes a job integration makes to its Workload."""

    RELEASE = "release"  # hand an evicted admission back
    FINISH = "finish"  # the job ended: release the quota
    PODS_READY = "podsReady"  # every worker runs


def due_patch(
    change: WorkloadChange,
    workload: Mapping[str, Any],
    now: dt.datetime,
    succeeded: bool = True,
    message: str = "",
) -> Manifest | None:
    """The patch for `change` against the Workload as it is now; None when it no longer applies (it
    was made already, or Kueue moved on), so asking twice writes once."""
    try:
        admission = read_admission(workload)
    except WorkloadReadError:
        return None
    if change is WorkloadChange.RELEASE:
        return release_after_eviction(workload, now) if admission.phase is WorkloadPhase.EVICTED else None
    if change is WorkloadChange.FINISH:
        return mark_finished(workload, succeeded, message, now) if admission.finish is None else None
    ready = _condition(workload, Condition.PODS_READY)
    if admission.phase is not WorkloadPhase.ADMITTED or (ready is not None and ready.get("status") == "True"):
        return None
    return mark_pods_ready(workload, now)
