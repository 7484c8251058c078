"""The scheduler's output: what the operator should do after one cycle."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hetero_operator.scheduler.reasons import WaitReason
from hetero_operator.scheduler.snapshot import Allocation


@dataclass(frozen=True, slots=True)
class Resize:
    """A running job moves to ``allocation``; it saves a checkpoint and restarts on the new GPUs."""

    allocation: Allocation
    reason: str


@dataclass(frozen=True, slots=True)
class Preemption:
    """A running job gives all its GPUs back and re-queues; it saves a checkpoint first."""

    reason: str


@dataclass(frozen=True, slots=True)
class CycleMetrics:
    """Counts the operator exports after a cycle (the cycle's duration is measured by the caller)."""

    queue_length: Mapping[str, int]
    gpus_allocated: Mapping[str, int]
    gpus_free: Mapping[str, int]
    jobs_placed: int
    jobs_preempted: int
    jobs_resized: int


@dataclass(frozen=True, slots=True)
class Decisions:
    """Everything one cycle decided, keyed by job ("namespace/name").

    ``place``: queued jobs to start now. ``grow``/``shrink``: running jobs to resize. ``preempt``:
    running jobs to stop and re-queue. ``unschedulable``: why each still-waiting job waits, per
    class, as data (`reasons.format_wait` makes the sentence). ``predicted_samples_per_second``:
    throughput predicted for every placed or resized job.
    """

    place: Mapping[str, Allocation]
    grow: Mapping[str, Resize]
    shrink: Mapping[str, Resize]
    preempt: Mapping[str, Preemption]
    unschedulable: Mapping[str, WaitReason]
    predicted_samples_per_second: Mapping[str, float]
    metrics: CycleMetrics
