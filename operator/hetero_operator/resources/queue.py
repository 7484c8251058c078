"""`HeteroQueue` (cluster-scoped): a tenant's weight, GPU quotas per class and the cohort it borrows in.

Jobs name their queue in ``spec.queue``. With no HeteroQueue in the cluster, the scheduler runs as one
unlimited queue; once any exists, a job naming none is refused (its ``Placed`` condition names
``spec.queue``). Usage is charged in reference-GPU seconds at each job's speed on each class, and
queues of equal priority jobs are served lowest weighted usage first (see `scheduler.charging`).
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from hetero_operator.resources.base import (
    DNS_LABEL_PATTERN,
    MAX_GPU_CLASSES,
    CelRule,
    ObjectName,
    WireModel,
    cel_rules,
)

MAX_QUOTA_GPUS = 1_000_000

LENDING_LE_NOMINAL = CelRule(
    rule="!has(self.lendingLimit) || self.lendingLimit <= self.nominal",
    message="lendingLimit must be <= nominal: a queue lends only GPUs it owns",
    field_path=".lendingLimit",
)
QUOTA_CLASSES_UNIQUE = CelRule(
    rule="!has(self.quotas) || self.quotas.all(q, self.quotas.exists_one(r, r.gpuClass == q.gpuClass))",
    message="quotas must name each gpuClass once: merge the repeated entries",
    field_path=".quotas",
    reason="FieldValueDuplicate",
)
LIMITS_NEED_COHORT = CelRule(
    rule="has(self.cohort) || !has(self.quotas) || "
    "self.quotas.all(q, !has(q.borrowingLimit) && !has(q.lendingLimit))",
    message="borrowingLimit and lendingLimit apply only within a cohort: set cohort or remove them",
    field_path=".cohort",
)

CohortName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


class ClassQuotaSpec(WireModel):
    """GPUs of one class the queue owns, may borrow from its cohort and may lend to it."""

    model_config = ConfigDict(json_schema_extra=cel_rules(LENDING_LE_NOMINAL))

    gpu_class: ObjectName = Field(description="Name of a GPUClass.")
    nominal: int = Field(ge=0, le=MAX_QUOTA_GPUS, description="GPUs of this class the queue owns.")
    borrowing_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_GPUS,
        description="Most GPUs beyond nominal the queue may borrow from its cohort; unset: no limit.",
    )
    lending_limit: int | None = Field(
        default=None,
        ge=0,
        le=MAX_QUOTA_GPUS,
        description="Most of its unused nominal GPUs the cohort may borrow; unset: all of them. Borrowed "
        "GPUs are reclaimed (the borrowing jobs checkpoint and stop) when this queue needs them.",
    )

    @model_validator(mode="after")
    def _lending_le_nominal(self) -> Self:
        if self.lending_limit is not None and self.lending_limit > self.nominal:
            raise LENDING_LE_NOMINAL.violation(
                f"got lendingLimit={self.lending_limit}, nominal={self.nominal}"
            )
        return self


class HeteroQueueSpec(WireModel):
    """A tenant's share of the cluster. A class the queue lists no quota for counts as nominal 0."""

    model_config = ConfigDict(json_schema_extra=cel_rules(QUOTA_CLASSES_UNIQUE, LIMITS_NEED_COHORT))

    weight: float = Field(
        default=1.0,
        gt=0,
        le=1_000_000,
        description="Fair-share weight: a queue with twice the weight is served as if it had used half.",
    )
    cohort: CohortName | None = Field(
        default=None, description="Queues of one cohort lend each other the quota they do not use."
    )
    quotas: list[ClassQuotaSpec] = Field(
        default_factory=list, max_length=MAX_GPU_CLASSES, description="Quota per GPUClass."
    )

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        classes = [q.gpu_class for q in self.quotas]
        repeated = sorted({c for c in classes if classes.count(c) > 1})
        if repeated:
            raise QUOTA_CLASSES_UNIQUE.violation(f"repeated: {', '.join(repeated)}")
        limited = [
            q.gpu_class for q in self.quotas if q.borrowing_limit is not None or q.lending_limit is not None
        ]
        if self.cohort is None and limited:
            raise LIMITS_NEED_COHORT.violation(f"limits set for {', '.join(limited)}")
        return self


class ClassUsage(WireModel):
    """GPUs of one class the queue's jobs hold."""

    gpu_class: ObjectName = Field(description="Name of a GPUClass.")
    gpus: int = Field(ge=0, description="GPUs of this class the queue's jobs hold.")
    nominal: int = Field(default=0, ge=0, description="The queue's nominal quota of this class.")
    borrowed: int = Field(default=0, ge=0, description="Of those GPUs, the ones beyond nominal.")


class HeteroQueueStatus(WireModel):
    """What the operator last charged and counted for this queue."""

    usage: list[ClassUsage] = Field(
        default_factory=list, max_length=MAX_GPU_CLASSES, description="GPUs held per class."
    )
    summary: str | None = Field(
        default=None, max_length=1024, description="Held over nominal per class, e.g. 'a100 6/4 v100 0/8'."
    )
    charged_usage: float = Field(
        default=0.0,
        ge=0,
        description="Charged usage in reference-GPU seconds, decayed (halved every charging half-life).",
    )
    share: float = Field(default=0.0, ge=0, description="Weighted share: lower is served first.")
    charged_at: float | None = Field(
        default=None, description="Unix time chargedUsage was last brought up to date."
    )
    running_jobs: int = Field(default=0, ge=0, description="Jobs of this queue holding GPUs.")
    pending_jobs: int = Field(default=0, ge=0, description="Jobs of this queue waiting for GPUs.")
    message: str | None = Field(
        default=None,
        max_length=4096,
        description="What in the spec the scheduler cannot use, naming the field (e.g. a quota for a "
        "GPUClass that does not exist, left out until it does).",
    )
