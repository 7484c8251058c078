"""`HeteroTrainJob.status`: what the operator observed and decided. Written only by the operator."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal, Self

from pydantic import Field, StringConstraints, model_validator

from hetero_operator.resources.base import MAX_GPU_CLASSES, MAX_WORKERS, ObjectName, WireModel

MAX_CONDITIONS = 16
MAX_REBALANCE_HISTORY = 20
MAX_REASON_LENGTH = 1024
MAX_MESSAGE_LENGTH = 32768


class Phase(StrEnum):
    """Where a job is in its life."""

    QUEUED = "Queued"
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(WireModel):
    """One aspect of the job's state, in the standard Kubernetes condition shape."""

    type: Annotated[
        str,
        StringConstraints(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
            r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ] = Field(description="Condition type in CamelCase, for example Scheduled or Ready.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the job this condition was computed from."
    )
    last_transition_time: datetime = Field(description="When status last changed.")
    reason: Annotated[
        str,
        StringConstraints(
            min_length=1, max_length=MAX_REASON_LENGTH, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
        ),
    ] = Field(description="Machine-readable CamelCase reason for the last transition.")
    message: Annotated[str, StringConstraints(max_length=MAX_MESSAGE_LENGTH)] = Field(
        description="Human-readable details of the last transition."
    )


class WorkerAllocation(WireModel):
    """One worker of the job and the GPUs it holds."""

    rank: int = Field(ge=0, lt=MAX_WORKERS, description="Worker rank in the process group.")
    node: ObjectName = Field(description="Node the worker pod is bound to.")
    gpu_class: ObjectName = Field(description="GPUClass of the node's GPUs.")
    gpus: int = Field(ge=1, le=64, description="GPUs the worker holds on its node.")
    virtual_worker: int | None = Field(
        default=None, ge=0, lt=MAX_WORKERS, description="HetPipe virtual worker this worker belongs to."
    )
    stage: int | None = Field(
        default=None, ge=0, le=64, description="HetPipe pipeline stage inside the virtual worker."
    )


def summarise_classes(workers: Sequence[WorkerAllocation]) -> str:
    """`fast:2,slow:1`: GPUs per class, most GPUs first, for the `kubectl get htj` Classes column."""
    gpus_per_class: Counter[str] = Counter()
    for worker in workers:
        gpus_per_class[worker.gpu_class] += worker.gpus
    ordered = sorted(gpus_per_class.items(), key=lambda item: (-item[1], item[0]))
    return ",".join(f"{name}:{count}" for name, count in ordered)


class Allocation(WireModel):
    """The GPUs the scheduler gave the job. Build it with `Allocation.from_workers` so the summary
    fields agree with the worker list."""

    workers: list[WorkerAllocation] = Field(
        default_factory=list, max_length=MAX_WORKERS, description="Workers, ordered by rank."
    )
    generation: int = Field(
        default=0,
        ge=0,
        description="Counts re-allocations (after a restart or node loss); 0 is the first placement.",
    )
    total_gpus: int = Field(default=0, ge=0, description="GPUs held by all workers.")
    classes: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="GPUs per class, for example fast:2,slow:1."
    )
    predicted_samples_per_second: float | None = Field(
        default=None, ge=0, description="Throughput the scheduler predicted for these GPUs."
    )

    @classmethod
    def from_workers(
        cls,
        workers: Sequence[WorkerAllocation],
        generation: int = 0,
        predicted_samples_per_second: float | None = None,
    ) -> Allocation:
        ordered = sorted(workers, key=lambda worker: worker.rank)
        return cls(
            workers=ordered,
            generation=generation,
            total_gpus=sum(worker.gpus for worker in ordered),
            classes=summarise_classes(ordered),
            predicted_samples_per_second=predicted_samples_per_second,
        )

    @model_validator(mode="after")
    def _ranks_are_dense(self) -> Self:
        ranks = [worker.rank for worker in self.workers]
        if ranks != list(range(len(ranks))):
            raise ValueError(f"allocation.workers[].rank must be 0..{len(ranks) - 1} in order, got {ranks}")
        return self


class Plan(WireModel):
    """The current split of the global batch, as published to the workers."""

    version: int = Field(
        ge=0, description="Plan version; the workers apply each new version at an epoch start."
    )
    epoch: int = Field(ge=0, description="First epoch the plan applies to.")
    global_batch: int = Field(ge=1, description="Global batch size of the plan.")
    local_batches: list[Annotated[int, Field(ge=0)]] = Field(
        max_length=MAX_WORKERS, description="Local batch size of each worker, by rank."
    )
    predicted_iteration_seconds: float = Field(ge=0, description="Iteration time the planner predicted.")
    measured_iteration_seconds: float | None = Field(
        default=None, ge=0, description="Mean iteration time measured under this plan."
    )

    @model_validator(mode="after")
    def _local_batches_sum_to_global(self) -> Self:
        total = sum(self.local_batches)
        if total != self.global_batch:
            raise ValueError(
                f"plan.localBatches must sum to plan.globalBatch ({total} != {self.global_batch})"
            )
        return self


class Progress(WireModel):
    """How far training has come."""

    epoch: int = Field(default=0, ge=0, description="Epochs completed.")
    samples_per_second: float = Field(default=0.0, ge=0, description="Training throughput over all workers.")
    eta_seconds: float | None = Field(
        default=None, ge=0, description="Estimated time until the last epoch completes."
    )
    updated_at: datetime | None = Field(
        default=None, description="When these figures were measured: the ETA counts down from here."
    )

    def time_left(self, now: float | None) -> float | None:
        """Seconds of training left at wall-clock ``now`` by the ETA (``None`` without one); the ETA
        as written when ``now`` or the time it was measured is unknown."""
        if self.eta_seconds is None:
            return None
        if now is None or self.updated_at is None:
            return self.eta_seconds
        return max(0.0, self.eta_seconds - max(0.0, now - self.updated_at.timestamp()))


class RebalanceRecord(WireModel):
    """One plan change and how its prediction turned out."""

    time: datetime = Field(description="When the new plan was published.")
    epoch: int = Field(ge=0, description="Epoch the new plan starts at.")
    from_version: int = Field(ge=0, description="Plan version replaced.")
    to_version: int = Field(ge=0, description="Plan version published.")
    predicted_gain: float = Field(description="Predicted relative drop in iteration time (0.1 = 10% faster).")
    predicted_iteration_seconds: float = Field(ge=0, description="Iteration time predicted for the new plan.")
    measured_iteration_seconds: float | None = Field(
        default=None, ge=0, description="Iteration time measured once the new plan ran."
    )
    reason: Annotated[str, StringConstraints(max_length=MAX_REASON_LENGTH)] = Field(
        default="", description="Why the plan changed, for example MeasuredSpeeds or BatchAdapted."
    )


class NodeExclusion(WireModel):
    """Nodes of a GPU class that take no new worker, and why."""

    filter: Annotated[str, StringConstraints(max_length=512)] = Field(
        description="The filter, for example cordoned, not Ready, or a taint that is not tolerated."
    )
    nodes: int = Field(ge=0, description="How many of the class's nodes it excludes.")


class ClassWait(WireModel):
    """One GPU class's side of a wait, as the scheduler recorded it."""

    gpu_class: Annotated[str, StringConstraints(max_length=253)] = Field(description="The GPUClass.")
    verdict: Literal["UnknownClass", "NotAllowed", "NoSchedulableNodes", "NotEnoughFree"] = Field(
        description="UnknownClass, NotAllowed (by spec.gpuClasses), NoSchedulableNodes or NotEnoughFree."
    )
    free: int = Field(default=0, ge=0, description="GPUs of the class the job could take now.")
    wanted: int = Field(default=0, ge=0, description="GPUs the job needs at once.")
    held_back: int = Field(default=0, ge=0, description="Free GPUs held back for a waiting queue head.")
    held_for: Annotated[str, StringConstraints(max_length=317)] | None = Field(
        default=None, description="That queue head (namespace/name)."
    )
    held_for_queue: Annotated[str, StringConstraints(max_length=253)] | None = Field(
        default=None, description="The queue of that head."
    )
    chunk: int = Field(default=1, ge=1, description="GPUs that must come together (a virtual worker).")
    nodes: int = Field(default=0, ge=0, description="Nodes of the class.")
    excluded: list[NodeExclusion] = Field(
        default_factory=list, max_length=16, description="Nodes left out of scheduling, by filter."
    )


class Waiting(WireModel):
    """Why the job is not placed, per GPU class (present while it waits)."""

    reason: Annotated[str, StringConstraints(max_length=64)] = Field(
        description="The same reason as the Placed condition's, for example WaitingForGPUs."
    )
    classes: list[ClassWait] = Field(default_factory=list, max_length=64, description="One entry per class.")


class MeasuredClass(WireModel):
    """The job's measured model of one GPU of a class, in ms for a local batch of b samples: compute
    takes computeMsPerSample·b + computeFixedMs, the first gradient bucket is ready after
    syncReadyMsPerSample·b + syncReadyFixedMs."""

    gpu_class: ObjectName = Field(description="The GPUClass.")
    compute_ms_per_sample: float = Field(ge=0, le=1e9, description="Compute time per sample (ms).")
    compute_fixed_ms: float = Field(ge=0, le=1e9, description="Compute time of a step at any batch (ms).")
    sync_ready_ms_per_sample: float = Field(
        ge=0, le=1e9, description="Time per sample until the first gradient bucket is ready (ms)."
    )
    sync_ready_fixed_ms: float = Field(
        ge=0, le=1e9, description="Fixed time until the first gradient bucket is ready (ms)."
    )
    workers: int = Field(ge=1, le=MAX_WORKERS, description="Workers of this class the model averages.")


class MeasuredProfile(WireModel):
    """What the job measured of itself, kept for its next placement (a restart, a resize or a requeue
    after a lost node): per-class models of one GPU and the all-reduce times."""

    classes: list[MeasuredClass] = Field(
        max_length=MAX_GPU_CLASSES,
        description="One model per GPUClass the job ran on.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["gpuClass"]},
    )
    overlapped_allreduce_ms: float = Field(
        ge=0, le=1e9, description="All-reduce time of every gradient bucket but the last (ms)."
    )
    last_bucket_allreduce_ms: float = Field(
        ge=0, le=1e9, description="All-reduce time of the last bucket (ms)."
    )
    plan_version: int = Field(ge=0, le=1_000_000_000, description="The plan under which it was measured.")


class HeteroTrainJobStatus(WireModel):
    """Observed state of the job, written by the operator through the status subresource."""

    phase: Phase | None = Field(
        default=None, description="Queued, Starting, Running, Succeeded, Failed, Suspended or Restarting."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Standard conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    allocation: Allocation | None = Field(default=None, description="GPUs the job holds.")
    waiting: Waiting | None = Field(default=None, description="Why the job waits to be placed, per class.")
    plan: Plan | None = Field(default=None, description="Current batch split.")
    progress: Progress | None = Field(default=None, description="Training progress.")
    measured: MeasuredProfile | None = Field(
        default=None, description="The job's measured speed per GPU class, used to place it again."
    )
    rebalances: list[RebalanceRecord] = Field(
        default_factory=list,
        max_length=MAX_REBALANCE_HISTORY,
        description=f"The last {MAX_REBALANCE_HISTORY} plan changes, oldest first.",
    )
    restarts: int = Field(default=0, ge=0, description="Restarts so far.")
    queued_at: datetime | None = Field(
        default=None,
        description="When the operator first queued the job, to the microsecond: the arrival order within "
        "a queue (creationTimestamp has whole seconds only).",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec the status reflects."
    )
    started_at: datetime | None = Field(
        default=None,
        description="When the job was first placed on GPUs: spec.activeDeadlineSeconds counts from here.",
    )
    finished_at: datetime | None = Field(
        default=None,
        description="When the job Succeeded or Failed: spec.ttlSecondsAfterFinished counts from here.",
    )

    def with_condition(self, condition: Condition) -> HeteroTrainJobStatus:
        """A copy with `condition` replacing any condition of the same type."""
        others = [existing for existing in self.conditions if existing.type != condition.type]
        return self.model_copy(update={"conditions": [*others, condition]})

    def with_rebalance(self, record: RebalanceRecord) -> HeteroTrainJobStatus:
        """A copy with `record` appended and the history trimmed to its bound."""
        history = [*self.rebalances, record][-MAX_REBALANCE_HISTORY:]
        return self.model_copy(update={"rebalances": history})
