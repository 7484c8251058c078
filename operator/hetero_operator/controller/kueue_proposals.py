"""Which Workload a job labelled for Kueue asks for (pure): its LocalQueue and ClusterQueue, the
quota that queue has for the job's GPU classes, and the best mix within it, as a Workload manifest;
or, when there is none, a reason that names the queue and the classes and says what to change."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from hetero_operator.controller.facts import ClassFacts
from hetero_operator.controller.inventory import ClusterView, build_snapshot, job_request
from hetero_operator.controller.job_cycle import JobCycle
from hetero_operator.kueue.constants import QUEUE_NAME_LABEL
from hetero_operator.kueue.facts import PROPOSED_AT_ANNOTATION, ClusterQueueFacts
from hetero_operator.kueue.proposal import mix_text, propose
from hetero_operator.kueue.quota import ClassQuota, class_quotas
from hetero_operator.kueue.workload import ProposedMix, WorkloadSpecError, build_workload, queue_name
from hetero_operator.resources import GPUClassSpec
from hetero_operator.scheduler import SchedulerConfig


class AdmittedReason(StrEnum):
    """Reasons of a job's `Admitted` condition (jobs under Kueue)."""

    SUBMITTED = "Submitted"  # a Workload was proposed
    PENDING = "Pending"  # it waits for quota; Kueue's reason in the message
    REPROPOSED = "Reproposed"  # it waited too long: a mix the unused quota admits replaced it
    QUOTA_RESERVED = "QuotaReserved"  # reserved, admission checks pending
    INACTIVE = "Inactive"  # spec.suspend
    ADMITTED = "Admitted"
    EVICTED = "Evicted"  # the workers save a checkpoint, then stop
    RELEASED = "Released"  # the workers stopped and the admission went back
    FINISHED = "Finished"  # the job ended; its quota is released
    WORKLOAD_FINISHED = "WorkloadFinished"  # someone finished the Workload early: a new one follows
    # No Workload: the message names the queue and the classes, and what to change.
    QUEUE_NOT_FOUND = "QueueNotFound"  # no such LocalQueue, or its ClusterQueue is missing
    CLASSES_NOT_OFFERED = "ClassesNotOffered"  # no flavor of the queue fits the job's classes
    QUOTA_TOO_SMALL = "QuotaTooSmall"  # the quota of those classes admits no placement
    INVALID_WORKLOAD = "InvalidWorkload"  # the mix cannot be a Workload (a class name, say)


@dataclass(frozen=True, slots=True)
class QueueQuota:
    """The job's queue and what it offers the job's classes."""

    local_queue: str  # its name, from the job's label
    cluster_queue: ClusterQueueFacts
    quotas: Mapping[str, ClassQuota]  # by GPU class; classes the queue has no quota for are left out


@dataclass(frozen=True, slots=True)
class WorkloadProposal:
    """A Workload to create, or the reason there is none (`reason`, `message`)."""

    manifest: Mapping[str, Any] | None
    mix: ProposedMix | None
    reason: AdmittedReason = AdmittedReason.SUBMITTED
    message: str = ""

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"]) if self.manifest is not None else ""


def _refused(reason: AdmittedReason, message: str) -> WorkloadProposal:
    return WorkloadProposal(None, None, reason, message)


def _job_classes(item: JobCycle, view: ClusterView) -> list[str]:
    wanted = list(item.job.spec.gpu_classes)
    return wanted or list(view.classes)


def queue_quota(item: JobCycle, view: ClusterView) -> QueueQuota | WorkloadProposal:
    """The job's queue and its quota per GPU class, or why the job cannot use it."""
    namespace = item.job.namespace
    name = queue_name(item.job) or ""
    local = view.kueue.local_queues.get((namespace, name))
    if local is None:
        return _refused(
            AdmittedReason.QUEUE_NOT_FOUND,
            f"no LocalQueue {name} in namespace {namespace}: create it or correct the job's "
            f"{QUEUE_NAME_LABEL} label",
        )
    cluster = view.kueue.cluster_queues.get(local.cluster_queue)
    if cluster is None:
        return _refused(
            AdmittedReason.QUEUE_NOT_FOUND,
            f"LocalQueue {name} refers to ClusterQueue {local.cluster_queue}, which does not exist",
        )
    classes = _job_classes(item, view)
    known = [view.classes[c] for c in classes if c in view.classes]
    quotas = class_quotas(cluster, view.kueue.flavors, known)
    if not quotas:
        return _refused(
            AdmittedReason.CLASSES_NOT_OFFERED,
            f"ClusterQueue {cluster.name} (LocalQueue {name}) offers no quota for the job's GPU classes "
            f"{', '.join(classes) or '(none exist)'}: give it a ResourceFlavor whose nodeLabels are the "
            "class's nodeSelector, with a nominalQuota of the class's GPU resource, or change "
            "spec.gpuClasses",
        )
    return QueueQuota(name, cluster, quotas)


def propose_workload(
    item: JobCycle,
    view: ClusterView,
    now: float,
    scheduler: SchedulerConfig,
    unused_only: bool = False,
) -> WorkloadProposal:
    """The Workload for the best mix the queue's quota can admit (`unused_only`: admit now)."""
    found = queue_quota(item, view)
    if isinstance(found, WorkloadProposal):
        return found
    caps = {c: (q.unused if unused_only else q.nominal) for c, q in found.quotas.items()}
    request = job_request(item.facts, item.job, item.status, holding=False)
    proposal = propose(request, build_snapshot(view, (), now), caps, scheduler)
    if proposal.mix is None:
        quota = "unused quota" if unused_only else "quota"
        return _refused(
            AdmittedReason.QUOTA_TOO_SMALL,
            f"ClusterQueue {found.cluster_queue.name} (LocalQueue {found.local_queue}): "
            f"the {quota} for the job's classes admits no placement: {proposal.problem}",
        )
    try:
        manifest = build_workload(item.job, proposal.mix, _specs(view.classes))
    except WorkloadSpecError as error:
        return _refused(AdmittedReason.INVALID_WORKLOAD, str(error))
    annotations = manifest["metadata"].setdefault("annotations", {})
    annotations[PROPOSED_AT_ANNOTATION] = f"{now:.3f}"
    return WorkloadProposal(manifest, proposal.mix)


def _specs(classes: Mapping[str, ClassFacts]) -> dict[str, GPUClassSpec]:
    """The GPUClass specs a Workload's pod templates are built from."""
    return {
        name: GPUClassSpec.model_validate(
            {
                "nodeSelector": dict(c.node_selector),
                "resourceName": c.resource_name,
                "memoryGiB": c.memory_gib,
                "relativeSpeed": c.relative_speed,
                "costWeight": c.cost_weight,
                "tolerations": [dict(t) for t in c.tolerations] or None,
            }
        )
        for name, c in classes.items()
    }


def describe_mix(mix: ProposedMix | Mapping[str, int]) -> str:
    """ "fast: 2, slow: 1 GPUs"."""
    return f"{mix_text(mix)} GPUs"
