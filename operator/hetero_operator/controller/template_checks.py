"""Problems of a job's spec.template that depend on the rest of the job or on the operator's
settings, so neither the CRD nor the model can see them (pure)."""

from __future__ import annotations

from hetero_operator.controller.pod_merge import job_template
from hetero_operator.resources import HeteroTrainJob
from hetero_operator.resources.pod_template import (
    OPERATOR_MOUNT_PATHS,
    OPERATOR_VOLUMES,
    WORKER_CONTAINER,
    TemplateContainer,
)

WORKER_PATH = f"spec.template.spec.containers[{WORKER_CONTAINER}]"
OPERATOR_PORT_NAMES = ("rendezvous", "metrics")


def template_problems(job: HeteroTrainJob, metrics_port: int, master_port: int) -> list[str]:
    """Every clash between the template and what the operator sets; empty when there is none."""
    template = job_template(job).spec
    problems = _unknown_mounts(job)
    worker = template.worker()
    if worker is None:
        return problems
    problems += _env_clashes(job, worker)
    problems += _port_clashes(worker, metrics_port, master_port)
    problems += _mount_path_clashes(job, worker)
    problems += _resource_clashes(job, worker)
    return problems


def _unknown_mounts(job: HeteroTrainJob) -> list[str]:
    template = job_template(job).spec
    known = {volume.name for volume in template.volumes}
    problems = []
    for kind, containers in (
        ("containers", template.containers),
        ("initContainers", template.init_containers),
    ):
        for container in containers:
            # The worker may mount the operator's volumes again elsewhere; sidecars may share them too.
            for mount in container.volume_mounts:
                if mount.name not in known and mount.name not in OPERATOR_VOLUMES:
                    problems.append(
                        f"spec.template.spec.{kind}[{container.name}].volumeMounts[{mount.name}]: no volume "
                        f"named {mount.name!r}; add it to spec.template.spec.volumes"
                    )
    return problems


def _env_clashes(job: HeteroTrainJob, worker: TemplateContainer) -> list[str]:
    spec_env = {variable.name for variable in job.spec.env}
    return [
        f"{WORKER_PATH}.env[{variable.name}]: also set in spec.env; set it in one place"
        for variable in worker.env
        if variable.name in spec_env
    ]


def _port_clashes(worker: TemplateContainer, metrics_port: int, master_port: int) -> list[str]:
    problems = []
    for port in worker.ports:
        if port.container_port in (metrics_port, master_port) or port.name in OPERATOR_PORT_NAMES:
            problems.append(
                f"{WORKER_PATH}.ports[{port.name or port.container_port}]: the operator's rendezvous "
                f"({master_port}) and metrics ({metrics_port}) ports and names are its own; use another port"
            )
    return problems


def _mount_path_clashes(job: HeteroTrainJob, worker: TemplateContainer) -> list[str]:
    taken = set(OPERATOR_MOUNT_PATHS)
    if job.spec.checkpoint is not None and job.spec.checkpoint.path.startswith("/"):
        taken.add(job.spec.checkpoint.path)
    return [
        f"{WORKER_PATH}.volumeMounts[{mount.name}].mountPath: {mount.mount_path} is where the operator "
        "mounts one of its volumes; choose another path"
        for mount in worker.volume_mounts
        if mount.mount_path.rstrip("/") in taken
    ]


def _resource_clashes(job: HeteroTrainJob, worker: TemplateContainer) -> list[str]:
    """GPUs come from the allocation; cpu and memory from spec.workerResources when it sets them."""
    resources = worker.resources or {}
    own = job.spec.worker_resources
    set_by_spec = {name for name, value in (("cpu", own.cpu), ("memory", own.memory)) if value is not None}
    problems = []
    for kind in ("requests", "limits"):
        for name in sorted(resources.get(kind) or {}):
            if "gpu" in name.lower():
                problems.append(
                    f"{WORKER_PATH}.resources.{kind}[{name}]: the operator sets each worker's GPUs from its "
                    "allocation; remove it and set spec.gpus"
                )
            elif name in set_by_spec:
                problems.append(
                    f"{WORKER_PATH}.resources.{kind}[{name}]: also set by spec.workerResources.{name}; "
                    "set it in one place"
                )
    return problems
