"""What the operator keeps of Kueue's objects: small frozen records parsed from API dictionaries, as
the kopf indexes store them, and `KueueView`, all of them at one moment.

Workloads are kept only when they belong to a HeteroTrainJob (the builder's labels); queues and
flavors are kept whole, as few as an administrator creates.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hetero_operator.controller.names import LABEL_JOB, LABEL_MANAGED_BY, MANAGED_BY
from hetero_operator.kueue.admission import WorkloadAdmission, WorkloadReadError, read_admission
from hetero_operator.kueue.constants import JOB_UID_LABEL, Condition

PROPOSED_AT_ANNOTATION = "heterotrain.io/proposed-at"
"""On a Workload: when the operator proposed its mix (seconds since the epoch), so the time it has
waited for admission survives a restart of the operator."""


def _time(value: Any) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def _count(value: Any) -> int:
    """A whole-number quantity (GPUs); anything else counts as zero."""
    try:
        return int(str(value))
    except ValueError:
        return 0


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    """A Workload the operator created for a job, and what Kueue decided about it."""

    namespace: str
    name: str
    job: str
    job_uid: str
    proposed_at: float
    deleting: bool
    requested: tuple[tuple[str, int], ...]  # (pod set = GPU class, pods), in the Workload's order
    admission: WorkloadAdmission | None  # None when it cannot be read (see `problem`)
    pods_ready: bool = False
    pending_since: float = 0.0  # since when it waits for quota (its proposal, or its last release)
    problem: str | None = None

    @property
    def job_key(self) -> str:
        return f"{self.namespace}/{self.job}"

    def mix(self) -> dict[str, int]:
        return dict(self.requested)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> WorkloadFacts | None:
        """None for a Workload that is not a HeteroTrainJob's."""
        metadata = body.get("metadata") or {}
        labels = metadata.get("labels") or {}
        if labels.get(LABEL_MANAGED_BY) != MANAGED_BY or not labels.get(LABEL_JOB):
            return None
        annotations = metadata.get("annotations") or {}
        created = _time(metadata.get("creationTimestamp")) or 0.0
        try:
            proposed = float(annotations.get(PROPOSED_AT_ANNOTATION, created))
        except ValueError:
            proposed = created
        pod_sets = (body.get("spec") or {}).get("podSets") or []
        requested = tuple((str(p.get("name", "")), _count(p.get("count", 0))) for p in pod_sets)
        admission, problem = None, None
        try:
            admission = read_admission(body)
        except WorkloadReadError as error:
            problem = str(error)
        conditions = {c.get("type"): c for c in (body.get("status") or {}).get("conditions") or []}
        reserved = conditions.get(Condition.QUOTA_RESERVED) or {}
        released_at = _time(reserved.get("lastTransitionTime")) if reserved.get("status") == "False" else None
        ready = (conditions.get(Condition.PODS_READY) or {}).get("status") == "True"
        return cls(
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            job=str(labels[LABEL_JOB]),
            job_uid=str(labels.get(JOB_UID_LABEL, "")),
            proposed_at=proposed,
            deleting=metadata.get("deletionTimestamp") is not None,
            requested=requested,
            admission=admission,
            pods_ready=ready,
            pending_since=max(proposed, released_at or 0.0),
            problem=problem,
        )


@dataclass(frozen=True, slots=True)
class LocalQueueFacts:
    namespace: str
    name: str
    cluster_queue: str

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> LocalQueueFacts:
        metadata = body.get("metadata") or {}
        return cls(
            namespace=str(metadata.get("namespace", "")),
            name=str(metadata.get("name", "")),
            cluster_queue=str((body.get("spec") or {}).get("clusterQueue", "")),
        )


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """One flavor of a ClusterQueue's resource group: its nominal quota per resource."""

    flavor: str
    nominal: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered: frozenset[str]
    flavors: tuple[FlavorQuota, ...]  # in the order Kueue tries them


@dataclass(frozen=True, slots=True)
class ClusterQueueFacts:
    name: str
    groups: tuple[ResourceGroup, ...]
    usage: Mapping[tuple[str, str], int] = field(default_factory=dict)  # (flavor, resource) -> in use
    stop_policy: str | None = None

    def used(self, flavor: str, resource: str) -> int:
        return self.usage.get((flavor, resource), 0)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ClusterQueueFacts:
        spec, status = body.get("spec") or {}, body.get("status") or {}
        groups = tuple(
            ResourceGroup(
                covered=frozenset(str(r) for r in group.get("coveredResources") or []),
                flavors=tuple(
                    FlavorQuota(
                        str(flavor.get("name", "")),
                        {
                            str(r.get("name")): _count(r.get("nominalQuota", 0))
                            for r in flavor.get("resources") or []
                        },
                    )
                    for flavor in group.get("flavors") or []
                ),
            )
            for group in spec.get("resourceGroups") or []
        )
        usage = {
            (str(flavor.get("name")), str(resource.get("name"))): _count(resource.get("total", 0))
            for flavor in status.get("flavorsUsage") or []
            for resource in flavor.get("resources") or []
        }
        stop = spec.get("stopPolicy")
        return cls(
            name=str((body.get("metadata") or {}).get("name", "")),
            groups=groups,
            usage=usage,
            stop_policy=None if stop in (None, "None") else str(stop),
        )


@dataclass(frozen=True, slots=True)
class FlavorFacts:
    name: str
    node_labels: Mapping[str, str]

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> FlavorFacts:
        spec = body.get("spec") or {}
        return cls(
            name=str((body.get("metadata") or {}).get("name", "")),
            node_labels={str(k): str(v) for k, v in (spec.get("nodeLabels") or {}).items()},
        )


@dataclass(frozen=True)
class KueueView:
    """Kueue's objects the operator reads, at one moment. Empty when the integration is off."""

    workloads: Mapping[str, tuple[WorkloadFacts, ...]] = field(default_factory=dict)  # by job key
    local_queues: Mapping[tuple[str, str], LocalQueueFacts] = field(default_factory=dict)
    cluster_queues: Mapping[str, ClusterQueueFacts] = field(default_factory=dict)
    flavors: Mapping[str, FlavorFacts] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        workloads: Iterable[WorkloadFacts],
        local_queues: Iterable[LocalQueueFacts],
        cluster_queues: Iterable[ClusterQueueFacts],
        flavors: Iterable[FlavorFacts],
    ) -> KueueView:
        by_job: dict[str, list[WorkloadFacts]] = {}
        for workload in workloads:
            by_job.setdefault(workload.job_key, []).append(workload)
        return cls(
            workloads={k: tuple(sorted(v, key=lambda w: w.name)) for k, v in by_job.items()},
            local_queues={(q.namespace, q.name): q for q in local_queues},
            cluster_queues={q.name: q for q in cluster_queues},
            flavors={f.name: f for f in flavors},
        )

    def workloads_of(self, job_key: str, uid: str) -> tuple[WorkloadFacts, ...]:
        """The job's Workloads (a job deleted and created again under the same name owns none of
        its predecessor's)."""
        return tuple(w for w in self.workloads.get(job_key, ()) if w.job_uid == uid)
