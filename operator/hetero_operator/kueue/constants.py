"""Names from Kueue's v1beta2 API that the builders and readers use (Kueue v0.19)."""

from __future__ import annotations

from enum import StrEnum

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
API_VERSION = f"{GROUP}/{VERSION}"

QUEUE_NAME_LABEL = f"{GROUP}/queue-name"
"""Opts a HeteroTrainJob in: the LocalQueue (in the job's namespace) its Workload is submitted to."""

JOB_UID_LABEL = f"{GROUP}/job-uid"
"""The owning job's uid on its Workload: Kueue names it in preemption messages ("JobUID: ...")."""

ADMISSION_FIELD_MANAGER = "kueue-admission"
"""Kueue applies a Workload's admission status with this field manager (server-side apply, forced).
Whoever hands an admission back must apply with the same manager, so that leaving `admission` out
removes it."""

MAX_POD_SETS = 18
"""Kueue's limit on `spec.podSets`, so on the GPU classes of one job's mix."""


class Condition(StrEnum):
    """Workload condition types."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"
    PODS_READY = "PodsReady"
    DEACTIVATION_TARGET = "DeactivationTarget"
    BLOCKED_ON_PREEMPTION_GATES = "BlockedOnPreemptionGates"


# The conditions Kueue's own admission patches carry (and so own through ADMISSION_FIELD_MANAGER).
ADMISSION_CONDITIONS = (
    Condition.QUOTA_RESERVED,
    Condition.BLOCKED_ON_PREEMPTION_GATES,
    Condition.EVICTED,
    Condition.ADMITTED,
    Condition.PREEMPTED,
    Condition.REQUEUED,
    Condition.DEACTIVATION_TARGET,
    Condition.FINISHED,
    Condition.PODS_READY,
)


class EvictionReason(StrEnum):
    """Reasons of `Evicted=True`. Kueue may add more; readers keep unknown ones as plain strings."""

    PREEMPTED = "Preempted"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    ADMISSION_CHECK = "AdmissionCheck"
    CLUSTER_QUEUE_STOPPED = "ClusterQueueStopped"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    DEACTIVATED = "Deactivated"
    NODE_FAILURES = "NodeFailures"
    MAXIMUM_EXECUTION_TIME_EXCEEDED = "MaximumExecutionTimeExceeded"


# Evictions after which Kueue's own job integrations set Requeued=True: the workload goes back to
# its queue at once. Any other eviction waits (a deactivated workload for spec.active, a stopped
# queue for its restart).
REQUEUED_EVICTIONS = frozenset({EvictionReason.PREEMPTED, EvictionReason.NODE_FAILURES})


class FinishReason(StrEnum):
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
