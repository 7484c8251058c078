"""The scheduler's pure core: one cycle maps an immutable `Snapshot` to `Decisions`.

Nothing here talks to Kubernetes; the operator builds the snapshot from its inventory, calls
`schedule`, and applies the decisions.
"""

from hetero_operator.scheduler.cycle import SchedulerConfig, schedule
from hetero_operator.scheduler.decisions import CycleMetrics, Decisions, Preemption, Resize
from hetero_operator.scheduler.reasons import ClassReason, ClassVerdict, WaitCode, WaitReason, format_wait
from hetero_operator.scheduler.snapshot import (
    Allocation,
    ClassProfile,
    GPUClassInfo,
    JobRequest,
    MeasuredProfile,
    NodeInfo,
    Snapshot,
    SnapshotError,
    WorkerSlot,
)
from hetero_operator.scheduler.throughput import PriorModel, clear_prediction_caches

__all__ = [
    "Allocation",
    "ClassProfile",
    "ClassReason",
    "ClassVerdict",
    "CycleMetrics",
    "Decisions",
    "GPUClassInfo",
    "JobRequest",
    "MeasuredProfile",
    "NodeInfo",
    "Preemption",
    "PriorModel",
    "Resize",
    "SchedulerConfig",
    "Snapshot",
    "SnapshotError",
    "WaitCode",
    "WaitReason",
    "WorkerSlot",
    "clear_prediction_caches",
    "format_wait",
    "schedule",
]
