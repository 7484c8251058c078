"""Request and response bodies of the HTTP API (camelCase on the wire, like the CRDs).

Job status pieces (allocation, plan, progress, rebalances, conditions) are the CRD's own models, so
the OpenAPI document describes exactly what `kubectl get htj -o yaml` shows.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic.alias_generators import to_camel

from hetero_operator.resources import (
    Allocation,
    ClassWait,
    Condition,
    HeteroTrainJobSpec,
    Phase,
    Plan,
    Progress,
    RebalanceRecord,
    Strategy,
    Waiting,
)
from hetero_operator.resources.base import DNS_LABEL_PATTERN, MAX_GPU_CLASSES, ObjectName
from hetero_operator.resources.workload_profile import ClassThroughput

MAX_POOL_NODES = 512
MAX_GPUS_PER_NODE = 64

PoolSource = Literal["live", "request"]
Namespace = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Problem(ApiModel):
    """An error: what went wrong and what to do about it."""

    detail: str = Field(description="Human-readable explanation naming the field or permission involved.")


class Health(ApiModel):
    status: Literal["ok", "failing"] = Field(description="'ok' when every check passes.")
    checks: dict[str, str] = Field(description="Each check and its outcome ('ok' or why not).")


class Readiness(ApiModel):
    ready: bool = Field(description="True when every check passes.")
    checks: dict[str, str] = Field(description="Each check and its outcome ('ok' or why not).")


# --- pools ---------------------------------------------------------------------------------------


class PoolNode(ApiModel):
    name: str
    schedulable: bool = Field(description="Ready, not cordoned and no untolerated NoSchedule taint.")
    gpus_total: int = Field(ge=0, description="Allocatable GPUs of the class's resource.")
    gpus_allocated: int = Field(ge=0, description="GPUs held by job allocations and other pods.")
    gpus_free: int = Field(ge=0, description="GPUs a new job could get here (0 on unschedulable nodes).")


class GPUPool(ApiModel):
    """One GPUClass and the nodes that have it."""

    gpu_class: str
    relative_speed: float = Field(gt=0)
    memory_gib: float = Field(gt=0, alias="memoryGiB")
    cost_weight: float = Field(ge=0)
    nodes: list[PoolNode]
    gpus_total: int = Field(ge=0)
    gpus_allocated: int = Field(ge=0)
    gpus_free: int = Field(ge=0)


class PoolList(ApiModel):
    pools: list[GPUPool]


class WorkloadSummary(ApiModel):
    """One WorkloadProfile of the throughput catalog."""

    workload: str
    throughput: list[ClassThroughput] = Field(description="Samples/s of compute of one GPU, per class.")
    jobs: int = Field(ge=0, description="Jobs whose latest measurement the profile keeps.")
    updated_at: datetime | None = Field(default=None, description="When the last measurement arrived.")


class WorkloadList(ApiModel):
    items: list[WorkloadSummary]


# --- jobs ----------------------------------------------------------------------------------------


class JobSummary(ApiModel):
    """One row of `heterotrain jobs`."""

    namespace: str
    name: str
    phase: Phase | None = Field(default=None, description="Unset until the operator has seen the job.")
    strategy: Strategy | None = Field(default=None, description="Unset when the spec does not parse.")
    queue: str | None = None
    priority: int | None = None
    gpus: int = Field(ge=0, description="GPUs the job holds now.")
    classes: str = Field(description="GPUs per class, for example fast:2,slow:1.")
    epoch: int = Field(ge=0, description="Epochs completed.")
    epochs: int | None = Field(default=None, ge=1, description="Epochs asked for.")
    samples_per_second: float | None = Field(default=None, ge=0)
    restarts: int = Field(ge=0)
    created: datetime | None = None
    message: str = Field(description="Why the job waits or failed; empty when nothing is wrong.")


class JobList(ApiModel):
    items: list[JobSummary]


class JobDetail(JobSummary):
    """Everything `heterotrain describe` shows."""

    gpus_min: int | None = Field(default=None, ge=1)
    gpus_max: int | None = Field(default=None, ge=1)
    gpu_classes: list[str] = Field(description="Allowed GPUClasses, most preferred first; empty: any.")
    global_batch: int | None = Field(default=None, ge=1)
    allocation: Allocation | None = None
    plan: Plan | None = None
    progress: Progress | None = None
    rebalances: list[RebalanceRecord] = Field(description="Plan changes, oldest first.")
    waiting: Waiting | None = Field(default=None, description="Why the job waits, per GPU class.")
    conditions: list[Condition]
    problems: list[str] = Field(description="Why the spec is invalid, one field per line.")


# --- what-if -------------------------------------------------------------------------------------


class PoolClassSpec(ApiModel):
    """A GPU class of a hypothetical pool."""

    name: ObjectName
    relative_speed: float = Field(gt=0, le=1000, description="Throughput relative to a reference GPU.")
    memory_gib: float = Field(default=16.0, gt=0, le=4096, alias="memoryGiB")
    cost_weight: float = Field(default=1.0, ge=0, le=1_000_000)


class PoolNodeSpec(ApiModel):
    """A GPU node of a hypothetical pool."""

    name: ObjectName
    gpu_class: ObjectName = Field(description="Name of one of the pool's classes.")
    gpus: int = Field(ge=0, le=MAX_GPUS_PER_NODE)
    gpus_used: int = Field(default=0, ge=0, le=MAX_GPUS_PER_NODE, description="GPUs already taken.")
    schedulable: bool = True

    @model_validator(mode="after")
    def _used_within_capacity(self) -> Self:
        if self.gpus_used > self.gpus:
            raise ValueError(f"nodes[{self.name}].gpusUsed ({self.gpus_used}) must be <= gpus ({self.gpus})")
        return self


class PoolSpec(ApiModel):
    """A pool to plan against instead of the live cluster."""

    classes: list[PoolClassSpec] = Field(min_length=1, max_length=MAX_GPU_CLASSES)
    nodes: list[PoolNodeSpec] = Field(min_length=1, max_length=MAX_POOL_NODES)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        for field, names in (
            ("classes", [c.name for c in self.classes]),
            ("nodes", [n.name for n in self.nodes]),
        ):
            repeated = sorted(name for name, count in Counter(names).items() if count > 1)
            if repeated:
                raise ValueError(f"pool.{field}[].name must be unique; repeated: {', '.join(repeated)}")
        known = {c.name for c in self.classes}
        unknown = sorted({n.gpu_class for n in self.nodes} - known)
        if unknown:
            raise ValueError(
                f"pool.nodes[].gpuClass names classes not in pool.classes: {', '.join(unknown)}; add them"
            )
        return self


class WhatIfRequest(ApiModel):
    """A job that is not submitted, and optionally the pool to try it on (default: the live pool)."""

    namespace: Namespace = Field(default="default", description="Namespace the job would be created in.")
    name: ObjectName = Field(default="what-if", description="Name the job would have.")
    spec: HeteroTrainJobSpec
    pool: PoolSpec | None = Field(default=None, description="Unset: the cluster's GPUs, jobs and queues now.")


class ClassReason(ClassWait):
    """One GPUClass's side of a wait, as the scheduler recorded it, with the same as a phrase."""

    reason: str = Field(description="The class's side of the wait, as a phrase.")


class WhatIfResult(ApiModel):
    """Where the scheduler would put the job now and how fast it would train."""

    pool: PoolSource = Field(description="Which pool was planned against.")
    schedulable: bool = Field(description="True if the job would be placed in this scheduling cycle.")
    allocation: Allocation | None = Field(default=None, description="The GPUs it would get.")
    plan: Plan | None = Field(default=None, description="The first batch split it would start with.")
    predicted_samples_per_second: float | None = Field(default=None, ge=0)
    predicted_iteration_seconds: float | None = Field(default=None, ge=0)
    message: str = Field(description="The scheduler's explanation when the job would wait.")
    reason: str | None = Field(
        default=None, description="Why it would wait, as the Placed condition's reason (e.g. WaitingForGPUs)."
    )
    class_reasons: list[ClassReason] = Field(description="Why each GPUClass cannot take the job now.")
    would_preempt: list[str] = Field(
        description="Running jobs (namespace/name) this job would shrink or preempt to make room."
    )
