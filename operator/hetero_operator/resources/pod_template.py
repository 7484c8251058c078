"""`HeteroTrainJob.spec.template`: what a job adds to its worker pods.

A pod-template-like object: the container named `worker` is merged into the operator's worker
container, every other container is a sidecar, and pod-level fields (volumes, init containers,
tolerations, affinity, ...) are added to the pods the operator builds. Fields the operator owns are
refused here, once, as CEL rules the API server runs and the same rules in the model validators.
A full PodSpec schema would make the CRD huge, so only the fields checked here are typed; the rest
are kept as given (`x-kubernetes-preserve-unknown-fields`) and checked by the API server when the
pods are created.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, Self

from pydantic import AfterValidator, ConfigDict, Field, StringConstraints, model_validator
from pydantic.json_schema import JsonDict

from hetero_operator import metric_names
from hetero_operator import plan as contract
from hetero_operator.resources.base import (
    DNS_LABEL_PATTERN,
    MAX_NAME_LENGTH,
    BoundedString,
    CelRule,
    WireModel,
    cel_rules,
)

WORKER_CONTAINER = "worker"
PLAN_MOUNT_DIR = "/etc/heterotrain/plan"
PODINFO_MOUNT_DIR = "/etc/heterotrain/podinfo"
# Volumes of the worker pod the operator builds (see the launcher): a template may not reuse a name.
OPERATOR_VOLUMES = ("plan", "podinfo", "tmp", "dshm", "checkpoint")
# Where the operator mounts them in the worker container (the checkpoint path is the job's).
OPERATOR_MOUNT_PATHS = (PLAN_MOUNT_DIR, PODINFO_MOUNT_DIR, "/tmp", "/dev/shm")
# Label and annotation prefixes the operator writes on worker pods.
OPERATOR_LABEL_PREFIXES = ("heterotrain.io/", "app.kubernetes.io/managed-by")
OPERATOR_ANNOTATION_PREFIXES = ("heterotrain.io/", "prometheus.io/")

# Environment variables the operator sets in the worker container; a job may not set them.
RESERVED_ENV = (
    contract.RANK_ENV,
    contract.WORLD_SIZE_ENV,
    contract.MASTER_ADDR_ENV,
    contract.MASTER_PORT_ENV,
    contract.PLAN_SOURCE_ENV,
    contract.EPOCHS_ENV,
    contract.CHECKPOINT_DIR_ENV,
    contract.CHECKPOINT_EVERY_ENV,
    contract.CHECKPOINT_RANK0_ONLY_ENV,
    metric_names.METRICS_PORT_ENV,
    metric_names.JOB_NAME_ENV,
    metric_names.GPU_CLASS_ENV,
    contract.PRECISION_ENV,
    contract.LOCAL_RANK_ENV,
    contract.LOCAL_WORLD_SIZE_ENV,
    contract.POD_ANNOTATIONS_FILE_ENV,
    "POD_IP",
)

MAX_CONTAINERS = 16
MAX_ITEMS = 64
MAX_ENV = 128

ItemName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH)]
ContainerName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
FreeObject = dict[str, Any]
OwnedString = Annotated[str, StringConstraints(max_length=MAX_NAME_LENGTH)] | None
NAMED_MAP: JsonDict = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}


def _cel_list(values: Iterable[str]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


class KubeObject(WireModel):
    """A Kubernetes object whose unlisted fields are kept as given."""

    model_config = ConfigDict(extra="allow")

    def to_wire(self) -> dict[str, Any]:
        """The wire form without unset fields or empty lists, at every level (they add nothing)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_defaults=True)


class NamedItem(KubeObject):
    """An entry of a list keyed by name (an environment variable, a volume)."""

    name: ItemName = Field(description="Its name, unique in the list.")


class VolumeMount(KubeObject):
    """A Kubernetes VolumeMount."""

    name: ItemName = Field(description="Volume to mount (from template.spec.volumes).")
    mount_path: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="Where the volume appears in the container."
    )


class ContainerPort(KubeObject):
    """A Kubernetes ContainerPort."""

    container_port: int = Field(ge=1, le=65535, description="Port number the container listens on.")
    name: Annotated[str, StringConstraints(max_length=15)] | None = Field(
        default=None, description="Port name, unique in the pod."
    )


class Capabilities(KubeObject):
    """Linux capabilities of a container."""

    add: list[Annotated[str, StringConstraints(max_length=64)]] = Field(
        default_factory=list,
        max_length=64,
        description="Capabilities added to the container (refused unless the administrator allows them).",
    )


class ContainerSecurityContext(KubeObject):
    """A Kubernetes SecurityContext, merged over the operator's restricted one."""

    privileged: bool | None = Field(
        default=None, description="Privileged container (refused unless the administrator allows it)."
    )
    capabilities: Capabilities | None = Field(
        default=None, description="Capabilities to add; the operator drops all others."
    )


class TemplateContainer(KubeObject):
    """A container: the one named `worker` is merged into the operator's worker container (its
    image, command and args come from spec.image, spec.command and spec.args); any other is a
    sidecar and names its own image."""

    name: ContainerName = Field(description=f"Container name; `{WORKER_CONTAINER}` is the worker container.")
    image: Annotated[str, StringConstraints(max_length=1024)] | None = Field(
        default=None, description="Image of a sidecar or init container (the worker's is spec.image)."
    )
    command: list[BoundedString] | None = Field(
        default=None, max_length=MAX_ITEMS, description="Entrypoint of a sidecar or init container."
    )
    args: list[BoundedString] | None = Field(
        default=None, max_length=MAX_ITEMS, description="Arguments of a sidecar or init container."
    )
    env: list[NamedItem] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Environment variables (Kubernetes EnvVars); added after spec.env in the worker.",
        json_schema_extra=NAMED_MAP,
    )
    env_from: list[FreeObject] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description="ConfigMaps and Secrets whose keys become environment variables (EnvFromSource).",
    )
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Volumes mounted into the container."
    )
    ports: list[ContainerPort] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Ports the container listens on."
    )
    resources: FreeObject | None = Field(
        default=None,
        description="Kubernetes ResourceRequirements. For the worker, resources other than its GPUs, cpu "
        "and memory (those come from the allocation and spec.workerResources).",
    )
    security_context: ContainerSecurityContext | None = Field(
        default=None, description="Kubernetes SecurityContext, merged over the operator's restricted one."
    )


STAYS_NON_ROOT = CelRule(
    rule="!has(self.runAsNonRoot) || self.runAsNonRoot",
    message="template.spec.securityContext.runAsNonRoot must not be false: workers never run as root",
    field_path=".runAsNonRoot",
    reason="FieldValueForbidden",
)


class PodSecurityContext(KubeObject):
    """A Kubernetes PodSecurityContext, merged over the operator's (non-root, RuntimeDefault seccomp)."""

    model_config = ConfigDict(json_schema_extra=cel_rules(STAYS_NON_ROOT))

    run_as_non_root: bool | None = Field(
        default=None, description="May only be true: workers never run as root."
    )

    @model_validator(mode="after")
    def _non_root(self) -> Self:
        if self.run_as_non_root is False:
            raise STAYS_NON_ROOT.violation("got false")
        return self


def _owned(wire: str, fix: str) -> CelRule:
    return CelRule(
        rule=f"!has(self.{wire})",
        message=f"template.spec.{wire} must not be set: {fix}",
        field_path=f".{wire}",
        reason="FieldValueForbidden",
    )


OWNED_POD_FIELDS = {
    "node_name": _owned("nodeName", "the operator places each worker on its node"),
    "node_selector": _owned(
        "nodeSelector", "the operator places each worker; choose nodes with spec.gpuClasses"
    ),
    "hostname": _owned("hostname", "the operator names each worker for the rendezvous"),
    "subdomain": _owned("subdomain", "the job's headless Service is the workers' subdomain"),
    "restart_policy": _owned("restartPolicy", "workers never restart in place; set spec.restartPolicy"),
}
WORKER_SETS_NO_IMAGE = CelRule(
    rule=f"!has(self.containers) || !self.containers.exists(c, c.name == '{WORKER_CONTAINER}'"
    " && (has(c.image) || has(c.command) || has(c.args)))",
    message=f"template.spec.containers[{WORKER_CONTAINER}] must not set image, command or args: "
    "set spec.image, spec.command and spec.args",
    field_path=".containers",
    reason="FieldValueForbidden",
)
WORKER_ENV_NOT_RESERVED = CelRule(
    rule=f"!has(self.containers) || !self.containers.exists(c, c.name == '{WORKER_CONTAINER}'"
    f" && has(c.env) && c.env.exists(e, e.name in {_cel_list(RESERVED_ENV)}))",
    message=f"template.spec.containers[{WORKER_CONTAINER}].env must not set {', '.join(RESERVED_ENV)}: "
    "the operator sets them",
    field_path=".containers",
    reason="FieldValueForbidden",
)
SIDECARS_NAME_AN_IMAGE = CelRule(
    rule=f"!has(self.containers) || self.containers.all(c, c.name == '{WORKER_CONTAINER}' || has(c.image))",
    message=f"template.spec.containers other than {WORKER_CONTAINER} are sidecars and must set image",
    field_path=".containers",
    reason="FieldValueRequired",
)
INIT_CONTAINERS_NAME_AN_IMAGE = CelRule(
    rule="!has(self.initContainers)"
    f" || self.initContainers.all(c, c.name != '{WORKER_CONTAINER}' && has(c.image))",
    message=f"template.spec.initContainers must set image and must not be named {WORKER_CONTAINER}",
    field_path=".initContainers",
)
VOLUMES_NOT_THE_OPERATORS = CelRule(
    rule=f"!has(self.volumes) || self.volumes.all(v, !(v.name in {_cel_list(OPERATOR_VOLUMES)}))",
    message=f"template.spec.volumes must not be named {', '.join(OPERATOR_VOLUMES)}: the operator's own "
    "volumes have those names; rename the volume (and its volumeMounts)",
    field_path=".volumes",
    reason="FieldValueDuplicate",
)
LABELS_NOT_THE_OPERATORS = CelRule(
    rule="!has(self.labels) || self.labels.all(k, "
    + " && ".join(f"!k.startsWith('{p}')" for p in OPERATOR_LABEL_PREFIXES)
    + ")",
    message="template.metadata.labels must not use the operator's keys (heterotrain.io/..., "
    "app.kubernetes.io/managed-by): pick another key",
    field_path=".labels",
)
ANNOTATIONS_NOT_THE_OPERATORS = CelRule(
    rule="!has(self.annotations) || self.annotations.all(k, "
    + " && ".join(f"!k.startsWith('{p}')" for p in OPERATOR_ANNOTATION_PREFIXES)
    + ")",
    message="template.metadata.annotations must not use the operator's keys (heterotrain.io/..., "
    "prometheus.io/...): pick another key",
    field_path=".annotations",
)


class TemplateMetadata(WireModel):
    """Labels and annotations added to every worker pod (the operator's own keys are refused)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(LABELS_NOT_THE_OPERATORS, ANNOTATIONS_NOT_THE_OPERATORS)
    )

    labels: dict[str, Annotated[str, StringConstraints(max_length=63)]] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="Labels added to every worker pod."
    )
    annotations: dict[str, Annotated[str, StringConstraints(max_length=4096)]] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="Annotations added to every worker pod."
    )

    @model_validator(mode="after")
    def _not_owned(self) -> Self:
        labels = [key for key in self.labels if key.startswith(OPERATOR_LABEL_PREFIXES)]
        if labels:
            raise LABELS_NOT_THE_OPERATORS.violation(f"got {', '.join(labels)}")
        annotations = [key for key in self.annotations if key.startswith(OPERATOR_ANNOTATION_PREFIXES)]
        if annotations:
            raise ANNOTATIONS_NOT_THE_OPERATORS.violation(f"got {', '.join(annotations)}")
        return self


def _duplicates(names: list[str]) -> list[str]:
    return sorted({name for name in names if names.count(name) > 1})


class TemplatePodSpec(KubeObject):
    """Pod fields added to every worker pod. Lists (volumes, tolerations, imagePullSecrets, init
    containers, sidecars) are added to the operator's; anything else not owned by the operator
    (affinity, priorityClassName, securityContext, ...) is set as given."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            *OWNED_POD_FIELDS.values(),
            WORKER_SETS_NO_IMAGE,
            WORKER_ENV_NOT_RESERVED,
            SIDECARS_NAME_AN_IMAGE,
            INIT_CONTAINERS_NAME_AN_IMAGE,
            VOLUMES_NOT_THE_OPERATORS,
        )
    )

    containers: list[TemplateContainer] = Field(
        default_factory=list,
        max_length=MAX_CONTAINERS,
        description=f"`{WORKER_CONTAINER}` is merged into the worker container; any other is a sidecar.",
        json_schema_extra=NAMED_MAP,
    )
    init_containers: list[TemplateContainer] = Field(
        default_factory=list,
        max_length=MAX_CONTAINERS,
        description="Init containers, run before the worker.",
        json_schema_extra=NAMED_MAP,
    )
    volumes: list[NamedItem] = Field(
        default_factory=list,
        max_length=MAX_ITEMS,
        description=f"Kubernetes Volumes, added to the operator's ({', '.join(OPERATOR_VOLUMES)}).",
        json_schema_extra=NAMED_MAP,
    )
    tolerations: list[FreeObject] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Added to the GPU class's tolerations."
    )
    image_pull_secrets: list[FreeObject] = Field(
        default_factory=list, max_length=MAX_ITEMS, description="Secrets for pulling the images."
    )
    affinity: FreeObject | None = Field(default=None, description="Kubernetes Affinity of the workers.")
    priority_class_name: Annotated[str, StringConstraints(max_length=MAX_NAME_LENGTH)] | None = Field(
        default=None, description="PriorityClass of the worker pods."
    )
    security_context: PodSecurityContext | None = Field(
        default=None,
        description="Kubernetes PodSecurityContext, merged over the operator's.",
    )
    service_account_name: Annotated[str, StringConstraints(max_length=MAX_NAME_LENGTH)] | None = Field(
        default=None,
        description="Service account of the workers (refused unless the administrator allows it).",
    )
    automount_service_account_token: bool | None = Field(
        default=None, description="Mount an API token (refused when true unless the administrator allows it)."
    )
    host_network: bool | None = Field(
        default=None, description="Host network (refused when true unless the administrator allows it)."
    )
    host_pid: bool | None = Field(
        default=None, alias="hostPID", description="Host PID namespace (refused like hostNetwork)."
    )
    host_ipc: bool | None = Field(
        default=None, alias="hostIPC", description="Host IPC namespace (refused like hostNetwork)."
    )
    # Owned by the operator: declared only so that setting them is refused by name.
    node_name: OwnedString = Field(default=None, description="Refused: the operator's.")
    node_selector: dict[str, OwnedString] | None = Field(
        default=None, max_length=MAX_ITEMS, description="Refused: the operator's."
    )
    hostname: OwnedString = Field(default=None, description="Refused: the operator's.")
    subdomain: OwnedString = Field(default=None, description="Refused: the operator's.")
    restart_policy: OwnedString = Field(default=None, description="Refused: the operator's.")

    @model_validator(mode="after")
    def _not_owned(self) -> Self:
        for field, rule in OWNED_POD_FIELDS.items():
            if getattr(self, field) is not None:
                raise rule.violation(f"got {getattr(self, field)!r}")
        for kind, items in (("containers", self.containers), ("initContainers", self.init_containers)):
            repeated = _duplicates([item.name for item in items])
            if repeated:
                raise ValueError(f"template.spec.{kind} names must be unique: {', '.join(repeated)} repeats")
        worker = self.worker()
        if worker is not None:
            self._check_worker(worker)
        sidecars = [c.name for c in self.containers if c.name != WORKER_CONTAINER and c.image is None]
        if sidecars:
            raise SIDECARS_NAME_AN_IMAGE.violation(f"no image: {', '.join(sidecars)}")
        if any(c.name == WORKER_CONTAINER or c.image is None for c in self.init_containers):
            raise INIT_CONTAINERS_NAME_AN_IMAGE.violation(", ".join(c.name for c in self.init_containers))
        taken = sorted({v.name for v in self.volumes} & set(OPERATOR_VOLUMES))
        if taken:
            raise VOLUMES_NOT_THE_OPERATORS.violation(f"got {', '.join(taken)}")
        return self

    @staticmethod
    def _check_worker(worker: TemplateContainer) -> None:
        if worker.image is not None or worker.command is not None or worker.args is not None:
            raise WORKER_SETS_NO_IMAGE.violation("the worker container sets them")
        reserved = [variable.name for variable in worker.env if variable.name in RESERVED_ENV]
        if reserved:
            raise WORKER_ENV_NOT_RESERVED.violation(f"got {', '.join(reserved)}")

    def worker(self) -> TemplateContainer | None:
        """The entry merged into the operator's worker container, if the template has one."""
        return next((c for c in self.containers if c.name == WORKER_CONTAINER), None)

    def sidecars(self) -> list[TemplateContainer]:
        return [c for c in self.containers if c.name != WORKER_CONTAINER]


class WorkerPodTemplate(WireModel):
    """What the job adds to each worker pod: labels and annotations, and a pod spec whose container
    named `worker` is merged into the operator's worker container."""

    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata, description="Labels and annotations added to every worker pod."
    )
    spec: TemplatePodSpec = Field(
        default_factory=TemplatePodSpec,
        description="Pod fields added to every worker pod (a Kubernetes PodSpec without the fields the "
        "operator owns: nodeName, nodeSelector, hostname, subdomain, restartPolicy).",
    )


# --- spec.podOverrides, replaced by spec.template -------------------------------------------------

POD_OVERRIDES_REPLACED = CelRule(
    rule="false",
    message="podOverrides was replaced by template: move the pod fields to template.spec (tolerations, "
    "volumes, affinity, ...) and container fields to template.spec.containers[worker]",
    reason="FieldValueForbidden",
)


def _refuse_pod_overrides(value: dict[str, Any] | None) -> dict[str, Any] | None:
    if value is not None:
        raise POD_OVERRIDES_REPLACED.violation(f"got keys {', '.join(sorted(value)) or 'none'}")
    return value


RemovedPodOverrides = Annotated[
    dict[str, Any] | None,
    AfterValidator(_refuse_pod_overrides),
    Field(json_schema_extra=cel_rules(POD_OVERRIDES_REPLACED)),
]
