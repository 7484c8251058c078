"""Read what Kueue decided about a Workload: admitted where and how many, evicted why, finished how."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetero_operator.kueue.constants import REQUEUED_EVICTIONS, Condition, FinishReason


class WorkloadReadError(ValueError):
    """The object is not a Workload this reader understands; the message names the field."""


class WorkloadPhase(StrEnum):
    """Where a Workload stands, as the operator acts on it."""

    PENDING = "Pending"  # queued: no quota reserved
    INACTIVE = "Inactive"  # spec.active is false and nothing is reserved
    QUOTA_RESERVED = "QuotaReserved"  # reserved, waiting for admission checks
    ADMITTED = "Admitted"  # start (or keep) the workers on the admitted flavors
    EVICTED = "Evicted"  # still reserved but evicted: stop the workers, then hand the quota back
    FINISHED = "Finished"  # done; its quota is released


# --- the subset of the Workload the reader needs --------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)


class _Condition(_Wire):
    type: str
    status: str
    reason: str = ""
    message: str = ""


class _PodSetAssignment(_Wire):
    name: str
    flavors: dict[str, str] = Field(default_factory=dict)
    count: int | None = None


class _Admission(_Wire):
    cluster_queue: str = Field(alias="clusterQueue")
    pod_set_assignments: list[_PodSetAssignment] = Field(alias="podSetAssignments")


class _PodSet(_Wire):
    name: str = "main"
    count: int


class _Spec(_Wire):
    pod_sets: list[_PodSet] = Field(alias="podSets", min_length=1)
    queue_name: str = Field(default="", alias="queueName")
    active: bool = True


class _Status(_Wire):
    conditions: list[_Condition] = Field(default_factory=list)
    admission: _Admission | None = None


class _Workload(_Wire):
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: _Spec
    status: _Status = Field(default_factory=_Status)


# --- what the reader returns ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodSetAdmission:
    """One pod set as admitted: the flavor of each of its resources and how many pods."""

    name: str
    flavors: Mapping[str, str]
    count: int

    def flavor(self, resource: str) -> str | None:
        return self.flavors.get(resource)


@dataclass(frozen=True, slots=True)
class Eviction:
    """Why Kueue evicted the Workload (`Evicted=True`)."""

    reason: str
    message: str
    preemption_reason: str | None  # InClusterQueue, InCohortReclamation, ... when preempted

    @property
    def requeues(self) -> bool:
        """True when the Workload goes straight back to its queue (Requeued=True) once released."""
        return self.reason in REQUEUED_EVICTIONS


@dataclass(frozen=True, slots=True)
class Finish:
    reason: str
    message: str

    @property
    def succeeded(self) -> bool:
        return self.reason == FinishReason.SUCCEEDED


@dataclass(frozen=True, slots=True)
class WorkloadAdmission:
    """Kueue's decision about one Workload, typed."""

    name: str
    queue_name: str
    active: bool
    cluster_queue: str | None
    pod_sets: tuple[PodSetAdmission, ...]  # empty unless quota is reserved
    quota_reserved: bool
    admitted: bool
    eviction: Eviction | None
    finish: Finish | None
    waiting_reason: str | None  # QuotaReserved=False's reason while pending
    waiting_message: str | None

    @property
    def phase(self) -> WorkloadPhase:
        if self.finish is not None:
            return WorkloadPhase.FINISHED
        if self.eviction is not None and self.quota_reserved:
            return WorkloadPhase.EVICTED
        if self.admitted:
            return WorkloadPhase.ADMITTED
        if self.quota_reserved:
            return WorkloadPhase.QUOTA_RESERVED
        return WorkloadPhase.PENDING if self.active else WorkloadPhase.INACTIVE

    def counts_by_flavor(self, resource: str) -> dict[str, int]:
        """Pods admitted per flavor of `resource` over all pod sets (for example GPUs' flavors)."""
        counts: dict[str, int] = {}
        for pod_set in self.pod_sets:
            flavor = pod_set.flavor(resource)
            if flavor is not None:
                counts[flavor] = counts.get(flavor, 0) + pod_set.count
        return counts


def _true(conditions: Mapping[str, _Condition], kind: Condition) -> _Condition | None:
    found = conditions.get(kind)
    return found if found is not None and found.status == "True" else None


def _pod_sets(workload: _Workload) -> tuple[PodSetAdmission, ...]:
    admission = workload.status.admission
    if admission is None:
        return ()
    requested = {pod_set.name: pod_set.count for pod_set in workload.spec.pod_sets}
    result = []
    for assignment in admission.pod_set_assignments:
        if assignment.name not in requested:
            raise WorkloadReadError(
                f"status.admission.podSetAssignments names pod set {assignment.name!r}, which "
                f"spec.podSets does not have ({', '.join(sorted(requested))})"
            )
        # Kueue leaves count out when it admitted the whole pod set.
        count = assignment.count if assignment.count is not None else requested[assignment.name]
        result.append(PodSetAdmission(assignment.name, dict(assignment.flavors), count))
    return tuple(result)


def read_admission(workload: Mapping[str, Any]) -> WorkloadAdmission:
    """Kueue's decision about a v1beta2 Workload object as the API server returns it."""
    try:
        parsed = _Workload.model_validate(workload)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in error.errors(include_url=False)
        )
        raise WorkloadReadError(f"not a readable Workload: {problems}") from error
    conditions = {condition.type: condition for condition in parsed.status.conditions}
    reserved = _true(conditions, Condition.QUOTA_RESERVED) is not None and parsed.status.admission is not None
    evicted = _true(conditions, Condition.EVICTED)
    preempted = _true(conditions, Condition.PREEMPTED)
    finished = _true(conditions, Condition.FINISHED)
    waiting = conditions.get(Condition.QUOTA_RESERVED)
    waiting = waiting if waiting is not None and waiting.status == "False" else None
    return WorkloadAdmission(
        name=str(parsed.metadata.get("name", "")),
        queue_name=parsed.spec.queue_name,
        active=parsed.spec.active,
        cluster_queue=parsed.status.admission.cluster_queue if reserved and parsed.status.admission else None,
        pod_sets=_pod_sets(parsed) if reserved else (),
        quota_reserved=reserved,
        admitted=reserved and _true(conditions, Condition.ADMITTED) is not None,
        eviction=Eviction(evicted.reason, evicted.message, preempted.reason if preempted else None)
        if evicted
        else None,
        finish=Finish(finished.reason, finished.message) if finished else None,
        waiting_reason=waiting.reason if waiting else None,
        waiting_message=waiting.message if waiting else None,
    )
