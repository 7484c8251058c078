"""The Workload a HeteroTrainJob gets: one pod set per GPU class of the mix the planner proposes.

Kueue admits every pod set of a Workload or none, and gives each pod set one ResourceFlavor per
resource. A job spread over several GPU classes is therefore one pod set per class, each pinned to
its class by the GPUClass's node selector, so only the ResourceFlavor with those node labels fits.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetero_operator.controller.launcher import owner_reference, worker_resources
from hetero_operator.controller.names import (
    LABEL_GPU_CLASS,
    LABEL_JOB,
    LABEL_MANAGED_BY,
    MANAGED_BY,
    WORKER_CONTAINER,
)
from hetero_operator.controller.pod_merge import job_template, merge_pod_spec
from hetero_operator.kueue.constants import API_VERSION, JOB_UID_LABEL, MAX_POD_SETS, QUEUE_NAME_LABEL
from hetero_operator.resources import GPUClassSpec, HeteroTrainJob

Manifest = dict[str, Any]

# A pod set's name is a DNS label; it is the GPU class's name, so the admission reads back by class.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MAX_DNS_LABEL = 63


class WorkloadSpecError(ValueError):
    """The job or the mix cannot become a Workload; the message names the field and the fix."""


@dataclass(frozen=True, slots=True)
class ClassShare:
    """The workers of one GPU class in a mix; each holds `gpus_per_worker` GPUs of the class."""

    gpu_class: str
    workers: int
    gpus_per_worker: int = 1

    def __post_init__(self) -> None:
        if len(self.gpu_class) > _MAX_DNS_LABEL or not _DNS_LABEL.match(self.gpu_class):
            raise WorkloadSpecError(
                f"GPU class {self.gpu_class!r} cannot name a Kueue pod set: pod set names are DNS "
                f"labels (lowercase letters, digits and '-', at most {_MAX_DNS_LABEL} characters); "
                "rename the GPUClass"
            )
        if self.workers < 1:
            raise WorkloadSpecError(f"workers of class {self.gpu_class!r} must be >= 1, got {self.workers}")
        if self.gpus_per_worker < 1:
            raise WorkloadSpecError(
                f"gpusPerWorker of class {self.gpu_class!r} must be >= 1, got {self.gpus_per_worker}"
            )

    @property
    def gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclass(frozen=True, slots=True)
class ProposedMix:
    """How many workers of each GPU class a job asks Kueue for, in the order the pod sets get."""

    shares: tuple[ClassShare, ...]

    def __post_init__(self) -> None:
        if not self.shares:
            raise WorkloadSpecError("a mix needs at least one GPU class with workers")
        if len(self.shares) > MAX_POD_SETS:
            raise WorkloadSpecError(
                f"a mix of {len(self.shares)} GPU classes exceeds Kueue's {MAX_POD_SETS} pod sets per "
                "Workload: propose fewer classes"
            )
        classes = [share.gpu_class for share in self.shares]
        repeated = sorted({name for name in classes if classes.count(name) > 1})
        if repeated:
            raise WorkloadSpecError(f"a mix names each GPU class once; repeated: {', '.join(repeated)}")

    @classmethod
    def of(cls, workers_per_class: Mapping[str, int], gpus_per_worker: int = 1) -> ProposedMix:
        """A mix from `{class: workers}`, pod sets in the mapping's order."""
        return cls(tuple(ClassShare(c, n, gpus_per_worker) for c, n in workers_per_class.items()))

    @property
    def total_gpus(self) -> int:
        return sum(share.gpus for share in self.shares)

    def key(self) -> str:
        """`fast:2x1,slow:1x1`: the same for the same mix whatever the order of its classes."""
        parts = sorted(f"{s.gpu_class}:{s.workers}x{s.gpus_per_worker}" for s in self.shares)
        return ",".join(parts)


@dataclass(frozen=True, slots=True)
class WorkloadPriorityClass:
    """A Kueue WorkloadPriorityClass the Workload refers to, with the value the cluster gives it."""

    name: str
    value: int


def queue_name(job: HeteroTrainJob) -> str | None:
    """The LocalQueue a job is submitted to, or None when it is not labelled for Kueue."""
    labels = job.metadata.get("labels") or {}
    value = labels.get(QUEUE_NAME_LABEL)
    return str(value) if value else None


def workload_name(job: HeteroTrainJob, mix: ProposedMix) -> str:
    """`<job>-<8 hex>`, from the job's uid and the mix: building twice gives the same name (a second
    create is refused, never duplicated), and a re-proposed mix gets a Workload of its own."""
    digest = hashlib.sha256(f"{job.metadata.get('uid', '')}/{mix.key()}".encode()).hexdigest()[:8]
    return f"{job.name}-{digest}"


def pod_template(job: HeteroTrainJob, share: ClassShare, gpu_class: GPUClassSpec) -> Manifest:
    """What Kueue reads from one class's workers: their GPU requests, node selector and tolerations.

    The workers themselves are built by the launcher once Kueue admits the Workload; the template
    requests exactly what each of them will (the class's GPU resource, `gpus_per_worker` of it, and
    the job's CPU and memory per worker)."""
    gpus = str(share.gpus_per_worker)
    container: Manifest = {
        "name": WORKER_CONTAINER,
        "image": job.spec.image,
        "resources": worker_resources(job.spec.worker_resources, gpu_class.resource_name, gpus),
    }
    if job.spec.command:
        container["command"] = list(job.spec.command)
    if job.spec.args:
        container["args"] = list(job.spec.args)
    spec: Manifest = {
        "restartPolicy": "Never",
        "nodeSelector": dict(gpu_class.node_selector),
        "containers": [container],
    }
    if gpu_class.tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in gpu_class.tolerations]
    return {
        "metadata": {"labels": {LABEL_JOB: job.name, LABEL_GPU_CLASS: share.gpu_class}},
        "spec": merge_pod_spec(spec, job_template(job).spec),
    }


def build_workload(
    job: HeteroTrainJob,
    mix: ProposedMix,
    classes: Mapping[str, GPUClassSpec],
    priority_class: WorkloadPriorityClass | None = None,
) -> Manifest:
    """The v1beta2 Workload for `job` asking for `mix`; `classes` gives each class's GPUClass spec.

    The job owns it as its controller (deleting the job deletes it); `spec.active` follows the job's
    `spec.suspend`; the priority is the WorkloadPriorityClass's value when one is given, else the
    job's `spec.priority`."""
    queue = queue_name(job)
    if queue is None:
        raise WorkloadSpecError(
            f"HeteroTrainJob {job.namespace}/{job.name} has no {QUEUE_NAME_LABEL} label: label it with "
            "the name of a LocalQueue in its namespace to submit it to Kueue"
        )
    if not job.metadata.get("uid"):
        raise WorkloadSpecError(
            f"HeteroTrainJob {job.namespace}/{job.name} has no metadata.uid: build the Workload from the "
            "job as the API server returns it (the owner reference needs the uid)"
        )
    missing = [share.gpu_class for share in mix.shares if share.gpu_class not in classes]
    if missing:
        raise WorkloadSpecError(
            f"the mix names GPU classes with no GPUClass: {', '.join(missing)}; create them or propose "
            "a mix without them"
        )
    spec: Manifest = {
        "queueName": queue,
        "active": not job.spec.suspend,
        "podSets": [
            {"name": s.gpu_class, "count": s.workers, "template": pod_template(job, s, classes[s.gpu_class])}
            for s in mix.shares
        ],
    }
    if priority_class is None:
        spec["priority"] = job.spec.priority
    else:
        spec["priorityClassRef"] = {
            "group": "kueue.x-k8s.io",
            "kind": "WorkloadPriorityClass",
            "name": priority_class.name,
        }
        spec["priority"] = priority_class.value
    return {
        "apiVersion": API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": workload_name(job, mix),
            "namespace": job.namespace,
            "labels": {
                LABEL_JOB: job.name,
                LABEL_MANAGED_BY: MANAGED_BY,
                JOB_UID_LABEL: str(job.metadata["uid"]),
            },
            "ownerReferences": [owner_reference(job)],
        },
        "spec": spec,
    }
