"""Pure manifest builders: the objects one job's allocation generation needs.

Every name is derived from the job name and the allocation generation, so building twice gives the
same objects and creating them twice is harmless (the second create answers 409 AlreadyExists).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator import metric_names
from hetero_operator import plan as contract
from hetero_operator.controller import checkpoint_volume, names, pod_merge
from hetero_operator.controller.network_policy import NetworkPolicyOptions, network_policy
from hetero_operator.controller.pod_guards import WorkerGuards
from hetero_operator.resources import (
    API_VERSION,
    CheckpointAccessMode,
    CheckpointStorage,
    HeteroTrainJob,
    WorkerAllocation,
    WorkerResources,
    pod_template,
)
from hetero_operator.resources import Allocation as StatusAllocation

Manifest = dict[str, Any]

# Environment variables the operator sets; a job's env may not set them (see validation).
RESERVED_ENV = frozenset(pod_template.RESERVED_ENV)


@dataclass(frozen=True, slots=True)
class ClassLaunchInfo:
    """What a worker pod needs from its GPUClass."""

    resource_name: str = "nvidia.com/gpu"
    tolerations: tuple[Mapping[str, Any], ...] = ()


@settings(frozen=True)
class LaunchOptions:
    """How worker pods are built (the operator's settings)."""

    metrics_port: Annotated[
        int, Field(ge=1, le=65535, description="Port each worker serves its Prometheus metrics on.")
    ] = metric_names.DEFAULT_METRICS_PORT
    master_port: Annotated[
        int, Field(ge=1, le=65535, description="Port of rank 0's rendezvous (torch.distributed).")
    ] = names.DEFAULT_MASTER_PORT
    checkpoint_storage: Annotated[
        str, Field(description="Size of a job's checkpoint claim when its checkpoint path is a directory.")
    ] = "10Gi"
    checkpoint_storage_class: Annotated[
        str,
        Field(
            description="StorageClass of the checkpoint claims the operator creates (empty: the "
            "cluster's default)."
        ),
    ] = ""
    checkpoint_access_mode: Annotated[
        CheckpointAccessMode,
        Field(
            description="Access mode of checkpoint volumes: ReadWriteMany (every worker mounts it) or "
            "ReadWriteOnce (only rank 0 mounts it and sends the state to the others on a resume)."
        ),
    ] = CheckpointAccessMode.READ_WRITE_MANY
    run_as_user: Annotated[
        int, Field(ge=1, description="User (and group) id the workers run as; never root.")
    ] = 1000
    guards: Annotated[
        WorkerGuards, Field(description="What a job's spec.template may ask beyond restricted worker pods.")
    ] = field(default_factory=WorkerGuards)
    network_policy: Annotated[
        NetworkPolicyOptions, Field(description="A NetworkPolicy per job that shields its workers.")
    ] = field(default_factory=NetworkPolicyOptions)


@settings(frozen=True)
class LaunchSettings(LaunchOptions):
    classes: Mapping[str, ClassLaunchInfo] = field(default_factory=dict)

    def class_info(self, gpu_class: str) -> ClassLaunchInfo:
        return self.classes.get(gpu_class, ClassLaunchInfo())

    def checkpoint_volume(self, job: HeteroTrainJob) -> checkpoint_volume.CheckpointVolume | None:
        defaults = CheckpointStorage(
            storage_class_name=self.checkpoint_storage_class or None,
            access_mode=self.checkpoint_access_mode,
            size=self.checkpoint_storage,
        )
        return checkpoint_volume.resolve(job.name, job.spec.checkpoint, defaults)


def owner_reference(job: HeteroTrainJob) -> dict[str, Any]:
    """Makes the job own the object: the garbage collector deletes it with the job."""
    return {
        "apiVersion": API_VERSION,
        "kind": "HeteroTrainJob",
        "name": job.name,
        "uid": str(job.metadata.get("uid", "")),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: HeteroTrainJob, name: str, extra_labels: Mapping[str, str] | None = None) -> Manifest:
    labels = {names.LABEL_JOB: job.name, names.LABEL_MANAGED_BY: names.MANAGED_BY, **(extra_labels or {})}
    return {
        "name": name,
        "namespace": job.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(job)],
    }


def headless_service(job: HeteroTrainJob, settings: LaunchSettings) -> Manifest:
    """Gives every worker pod a stable DNS name `<hostname>.<job>` (rank 0 is the rendezvous)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, names.service_name(job.name)),
        "spec": {
            "clusterIP": "None",
            "selector": {names.LABEL_JOB: job.name},
            "publishNotReadyAddresses": True,
            "ports": [
                {"name": "rendezvous", "port": settings.master_port, "targetPort": settings.master_port},
                {"name": "metrics", "port": settings.metrics_port, "targetPort": settings.metrics_port},
            ],
        },
    }


def plan_config_map(job: HeteroTrainJob, plan: contract.Plan) -> Manifest:
    """The plan document the workers read (key `plan.json`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, names.plan_config_map_name(job.name)),
        "data": {contract.PLAN_CONFIGMAP_KEY: plan.to_json()},
    }


def checkpoint_claim(job: HeteroTrainJob, settings: LaunchSettings) -> Manifest | None:
    """A volume that outlives the pods (suspend, restarts) when the checkpoint path is a directory,
    unless the job mounts an existing claim."""
    volume = settings.checkpoint_volume(job)
    if volume is None or not volume.owned:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(job, volume.claim_name),
        "spec": checkpoint_volume.claim_spec(volume),
    }


def master_address(job: HeteroTrainJob, generation: int) -> str:
    """Rank 0's stable DNS name through the headless Service."""
    return f"{names.pod_hostname(generation, 0)}.{names.service_name(job.name)}.{job.namespace}.svc"


def worker_env(
    job: HeteroTrainJob, allocation: StatusAllocation, worker: WorkerAllocation, settings: LaunchSettings
) -> list[dict[str, Any]]:
    """User variables first, then the operator's contract with the runtime."""
    env: list[dict[str, Any]] = [variable.to_wire() for variable in job.spec.env]
    operator_env = {
        contract.RANK_ENV: str(worker.rank),
        contract.WORLD_SIZE_ENV: str(len(allocation.workers)),
        contract.MASTER_ADDR_ENV: master_address(job, allocation.generation),
        contract.MASTER_PORT_ENV: str(settings.master_port),
        contract.PLAN_SOURCE_ENV: f"{names.PLAN_MOUNT_DIR}/{contract.PLAN_CONFIGMAP_KEY}",
        contract.EPOCHS_ENV: str(job.spec.epochs),
        metric_names.METRICS_PORT_ENV: str(settings.metrics_port),
        metric_names.JOB_NAME_ENV: job.name,
        metric_names.GPU_CLASS_ENV: worker.gpu_class,
        contract.PRECISION_ENV: job.spec.precision.value,
        # A pod sees only its own GPUs: its first visible device is its own. With LOCAL_WORLD_SIZE, a
        # script that reads torchrun's variables runs as the pod's command itself.
        contract.LOCAL_RANK_ENV: "0",
        contract.LOCAL_WORLD_SIZE_ENV: "1",
        contract.POD_ANNOTATIONS_FILE_ENV: f"{names.PODINFO_MOUNT_DIR}/{names.PODINFO_ANNOTATIONS_FILE}",
    }
    if job.spec.checkpoint is not None:
        operator_env[contract.CHECKPOINT_DIR_ENV] = job.spec.checkpoint.path
        operator_env[contract.CHECKPOINT_EVERY_ENV] = str(job.spec.checkpoint.every_epochs)
    volume = settings.checkpoint_volume(job)
    if volume is not None and volume.rank0_only:
        operator_env[contract.CHECKPOINT_RANK0_ONLY_ENV] = "1"
    env += [{"name": key, "value": value} for key, value in operator_env.items()]
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    return env


def _restricted_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def worker_volumes(
    job: HeteroTrainJob, rank: int, settings: LaunchSettings
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the worker container's mounts, the pod's volumes): the plan, the pod's own annotations, a
    writable /tmp, a memory-backed /dev/shm and, for a checkpoint directory, the job's claim (on rank
    0 only when it is ReadWriteOnce)."""
    mounts: list[dict[str, Any]] = [
        {"name": "plan", "mountPath": names.PLAN_MOUNT_DIR, "readOnly": True},
        {"name": "podinfo", "mountPath": names.PODINFO_MOUNT_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]
    volumes: list[dict[str, Any]] = [
        {"name": "plan", "configMap": {"name": names.plan_config_map_name(job.name)}},
        # The kubelet keeps this file up to date: the worker sees the checkpoint annotation there.
        {
            "name": "podinfo",
            "downwardAPI": {
                "items": [
                    {
                        "path": names.PODINFO_ANNOTATIONS_FILE,
                        "fieldRef": {"fieldPath": "metadata.annotations"},
                    }
                ]
            },
        },
        {"name": "tmp", "emptyDir": {}},
        {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.worker_resources.shared_memory},
        },
    ]
    volume = settings.checkpoint_volume(job)
    if job.spec.checkpoint is not None and volume is not None and volume.mounted_on(rank):
        mounts.append(checkpoint_volume.container_mount(job.spec.checkpoint.path))
        volumes.append(checkpoint_volume.pod_volume(volume))
    return mounts, volumes


def worker_resources(spec: WorkerResources, gpu_resource: str, gpus: str) -> dict[str, Any]:
    """The container's requests and limits: its GPUs (limit = request, as extended resources must),
    the memory it asked for (limit = request: shared memory counts against it, and a pod over its
    request is the first to be evicted), and CPU as a request only (a CPU limit throttles the step)."""
    requests = {gpu_resource: gpus}
    limits = {gpu_resource: gpus}
    if spec.cpu is not None:
        requests["cpu"] = spec.cpu
    if spec.memory is not None:
        requests["memory"] = limits["memory"] = spec.memory
    return {"limits": limits, "requests": requests}


def worker_container(
    job: HeteroTrainJob,
    allocation: StatusAllocation,
    worker: WorkerAllocation,
    settings: LaunchSettings,
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    """The worker container: the user's image and command, the runtime's environment, and the
    worker's GPUs through its class's extended resource."""
    resource = settings.class_info(worker.gpu_class).resource_name
    container: dict[str, Any] = {
        "name": names.WORKER_CONTAINER,
        "image": job.spec.image,
        "env": worker_env(job, allocation, worker, settings),
        "ports": [
            {"name": "rendezvous", "containerPort": settings.master_port},
            {"name": "metrics", "containerPort": settings.metrics_port},
        ],
        "resources": worker_resources(job.spec.worker_resources, resource, str(worker.gpus)),
        "volumeMounts": mounts,
        "securityContext": _restricted_security_context(),
    }
    if job.spec.command:
        container["command"] = list(job.spec.command)
    if job.spec.args:
        container["args"] = list(job.spec.args)
    return container


def worker_pod(
    job: HeteroTrainJob, allocation: StatusAllocation, worker: WorkerAllocation, settings: LaunchSettings
) -> Manifest:
    """One worker: bound to its node (there is no scheduler between us and the kubelet), holding its
    GPUs through the class's extended resource."""
    generation = allocation.generation
    labels = {
        names.LABEL_RANK: str(worker.rank),
        names.LABEL_GENERATION: str(generation),
        names.LABEL_GPU_CLASS: worker.gpu_class,
    }
    metadata = _metadata(job, names.pod_name(job.name, generation, worker.rank), labels)
    metadata["annotations"] = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(settings.metrics_port),
        "prometheus.io/path": "/metrics",
    }
    mounts, volumes = worker_volumes(job, worker.rank, settings)
    spec: dict[str, Any] = {
        "nodeName": worker.node,
        "hostname": names.pod_hostname(generation, worker.rank),
        "subdomain": names.service_name(job.name),
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": settings.run_as_user,
            "runAsGroup": settings.run_as_user,
            "fsGroup": settings.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [worker_container(job, allocation, worker, settings, mounts)],
        "volumes": volumes,
    }
    tolerations = settings.class_info(worker.gpu_class).tolerations
    if tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_merge.merge_metadata(metadata, pod_merge.job_template(job)),
        "spec": pod_merge.merge_pod_spec(spec, pod_merge.job_template(job).spec),
    }


def worker_pods(
    job: HeteroTrainJob, allocation: StatusAllocation, settings: LaunchSettings
) -> list[Manifest]:
    return [worker_pod(job, allocation, worker, settings) for worker in allocation.workers]


def generation_manifests(
    job: HeteroTrainJob, allocation: StatusAllocation, plan: contract.Plan | None, settings: LaunchSettings
) -> list[Manifest]:
    """Everything one allocation generation needs, in creation order (pods last: they mount the rest);
    the plan ConfigMap only when `plan` is given (one published just before is not created twice)."""
    manifests = [headless_service(job, settings)]
    if settings.network_policy.enabled:
        manifests.append(
            network_policy(job, settings.network_policy, settings.metrics_port, owner_reference(job))
        )
    if plan is not None:
        manifests.append(plan_config_map(job, plan))
    claim = checkpoint_claim(job, settings)
    if claim is not None:
        manifests.append(claim)
    return [*manifests, *worker_pods(job, allocation, settings)]
