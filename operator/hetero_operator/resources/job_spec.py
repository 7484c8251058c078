"""`HeteroTrainJob.spec`: what the user asks for.

Every cross-field rule is declared once as a `CelRule` next to the model it constrains: the CRD
carries it as an `x-kubernetes-validations` entry, and the model validator raises the same message.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Self

from pydantic import ConfigDict, Field, StringConstraints, field_validator, model_validator

from hetero_operator.plan import Precision
from hetero_operator.resources.base import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    MAX_GPU_CLASSES,
    MAX_NAME_LENGTH,
    BoundedString,
    CelRule,
    ObjectName,
    Quantity,
    WireModel,
    cel_rules,
)
from hetero_operator.resources.checkpoint_storage import STORAGE_NEEDS_DIRECTORY, CheckpointStorage
from hetero_operator.resources.job_limits import (
    ActiveDeadlineSeconds,
    NonRetryableExitCodes,
    StartTimeoutSeconds,
    TtlSecondsAfterFinished,
)
from hetero_operator.resources.parallelism import Parallelism, Strategy
from hetero_operator.resources.pod_template import RemovedPodOverrides, WorkerPodTemplate

MAX_GPUS = 4096
MAX_GLOBAL_BATCH = 1 << 24
MAX_ARGS = 64
MAX_ENV = 128


# --- env ---------------------------------------------------------------------------------------

ENV_VALUE_OR_SOURCE = CelRule(
    rule="!(has(self.value) && has(self.valueFrom))",
    message="env[].value and env[].valueFrom are mutually exclusive: set one of them",
    field_path=".valueFrom",
    reason="FieldValueForbidden",
)


class EnvVar(WireModel):
    """An environment variable set in every worker container."""

    model_config = ConfigDict(json_schema_extra=cel_rules(ENV_VALUE_OR_SOURCE))

    name: Annotated[
        str, StringConstraints(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    ] = Field(description="Variable name, for example `LOG_LEVEL`.")
    value: BoundedString | None = Field(
        default=None, description="Literal value. Mutually exclusive with valueFrom."
    )
    value_from: dict[str, Any] | None = Field(
        default=None,
        description="A Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, ...), passed to the "
        "worker pods unchanged. Mutually exclusive with value.",
    )

    @model_validator(mode="after")
    def _value_or_source(self) -> Self:
        if self.value is not None and self.value_from is not None:
            raise ENV_VALUE_OR_SOURCE.violation(f"variable {self.name!r}")
        return self


# --- gpus --------------------------------------------------------------------------------------

GPUS_MIN_LE_MAX = CelRule(
    rule="self.min <= self.max",
    message="gpus.min must be <= gpus.max: lower gpus.min or raise gpus.max",
    field_path=".min",
)


class GpuRange(WireModel):
    """How many GPUs the job may use. The scheduler starts the job only when it can place at least
    `min` GPUs at once (gang scheduling) and never gives it more than `max`."""

    model_config = ConfigDict(json_schema_extra=cel_rules(GPUS_MIN_LE_MAX))

    min: int = Field(ge=1, le=MAX_GPUS, description="Fewest GPUs the job can start with.")
    max: int = Field(ge=1, le=MAX_GPUS, description="Most GPUs the job may be given.")

    @model_validator(mode="after")
    def _min_le_max(self) -> Self:
        if self.min > self.max:
            raise GPUS_MIN_LE_MAX.violation(f"got min={self.min}, max={self.max}")
        return self


# --- batch -------------------------------------------------------------------------------------

BATCH_MIN_LE_GLOBAL = CelRule(
    rule="!has(self.min) || self.min <= self.global",
    message="batch.min must be <= batch.global: lower batch.min or raise batch.global",
    field_path=".min",
)
BATCH_GLOBAL_LE_MAX = CelRule(
    rule="!has(self.max) || self.global <= self.max",
    message="batch.global must be <= batch.max: lower batch.global or raise batch.max",
    field_path=".max",
)

DNS_SUBDOMAIN_PATTERN_CEL = DNS_SUBDOMAIN_PATTERN.replace("\\.", "[.]")
BATCH_LIMIT_KEYS_ARE_NAMES = CelRule(
    # `[.]` rather than an escaped dot: a backslash would need escaping again inside the CEL string.
    rule=f"self.all(name, size(name) <= {MAX_NAME_LENGTH} && name.matches('{DNS_SUBDOMAIN_PATTERN_CEL}'))",
    message="batch.perGpuClassMax keys must be GPUClass names (lowercase DNS subdomain names)",
)

GpuClassBatchLimit = Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH)]


def _is_object_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and re.fullmatch(DNS_SUBDOMAIN_PATTERN, name) is not None


class Batch(WireModel):
    """Samples per training step summed over all workers, and how the operator may change it. The operator
    splits the global batch into per-worker local batches sized to each GPU's measured speed."""

    model_config = ConfigDict(json_schema_extra=cel_rules(BATCH_MIN_LE_GLOBAL, BATCH_GLOBAL_LE_MAX))

    global_batch: int = Field(
        alias="global",
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description="Global batch size: samples per step over all workers. The starting value when adaptive.",
    )
    min: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description="Smallest global batch when adaptive. Unset: global.",
    )
    max: int | None = Field(
        default=None,
        ge=1,
        le=MAX_GLOBAL_BATCH,
        description="Largest global batch when adaptive. Unset: global.",
    )
    adaptive: bool = Field(
        default=False,
        description="Let the operator change the global batch between min and max to maximise goodput "
        "(statistical efficiency times throughput).",
    )
    per_gpu_class_max: dict[str, GpuClassBatchLimit] = Field(
        default_factory=dict,
        max_length=MAX_GPU_CLASSES,
        description="Largest local batch per GPU of a class (GPUClass name to samples), for example to stay "
        "within a small GPU's memory.",
        json_schema_extra=cel_rules(BATCH_LIMIT_KEYS_ARE_NAMES),
    )

    @field_validator("per_gpu_class_max")
    @classmethod
    def _keys_are_names(cls, limits: dict[str, int]) -> dict[str, int]:
        bad = sorted(name for name in limits if not _is_object_name(name))
        if bad:
            raise BATCH_LIMIT_KEYS_ARE_NAMES.violation(f"got {', '.join(map(repr, bad))}")
        return limits

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min is not None and self.min > self.global_batch:
            raise BATCH_MIN_LE_GLOBAL.violation(f"got min={self.min}, global={self.global_batch}")
        if self.max is not None and self.global_batch > self.max:
            raise BATCH_GLOBAL_LE_MAX.violation(f"got global={self.global_batch}, max={self.max}")
        return self

    @property
    def lowest(self) -> int:
        return self.global_batch if self.min is None else self.min

    @property
    def highest(self) -> int:
        return self.global_batch if self.max is None else self.max


# --- the rest of the spec ----------------------------------------------------------------------


class InitialSplit(StrEnum):
    """How the first plan of an allocation splits the global batch."""

    AUTO = "auto"
    PRIOR = "prior"
    EVEN = "even"


class Rebalance(WireModel):
    """Between epochs the operator refits each worker's speed from Prometheus metrics and, when the
    predicted gain is large enough, re-splits the batch (a new plan version)."""

    enabled: bool = Field(default=True, description="Re-split the batch from measured speeds.")
    every_epochs: int = Field(
        default=1, ge=1, le=10_000, description="Consider a new plan every this many epochs."
    )
    min_improvement: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Smallest predicted relative drop in iteration time (0.05 = 5%) that justifies a "
        "new plan.",
    )
    initial_split: InitialSplit = Field(
        default=InitialSplit.AUTO,
        description="First plan of an allocation: `auto` splits the batch by measured speed per GPU "
        "class (the job's own measurement, else its workload's WorkloadProfile), by relativeSpeed for "
        "classes neither has measured; `prior` splits by each GPUClass's relativeSpeed alone; `even` "
        "gives every worker the same share and lets measurements decide.",
    )


class Checkpoint(WireModel):
    """Where workers save and resume training state; restarts resume from the newest checkpoint."""

    model_config = ConfigDict(json_schema_extra=cel_rules(STORAGE_NEEDS_DIRECTORY))

    path: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="Directory (or URL understood by the training script) holding checkpoints."
    )
    every_epochs: int = Field(
        default=1, ge=1, le=10_000, description="Save a checkpoint every this many epochs."
    )
    storage: CheckpointStorage | None = Field(
        default=None,
        description="The volume mounted at path (a directory): a claim the operator creates or an "
        "existing one. Default: a claim with the operator's launch settings.",
    )

    @model_validator(mode="after")
    def _storage_needs_directory(self) -> Self:
        if self.storage is not None and not self.path.startswith("/"):
            raise STORAGE_NEEDS_DIRECTORY.violation(f"path={self.path!r}")
        return self


DEFAULT_SHARED_MEMORY = "1Gi"


class WorkerResources(WireModel):
    """CPU and memory of each worker pod beside its GPUs, and its shared memory (/dev/shm): NCCL and
    data-loader processes exchange tensors there, and a container's default is only 64 MiB."""

    cpu: Quantity | None = Field(
        default=None,
        description="CPU each worker requests, as a Kubernetes quantity (e.g. 4 or 3500m); no limit is "
        "set, so a worker may use idle cores.",
    )
    memory: Quantity | None = Field(
        default=None,
        description="Memory each worker requests and is limited to, as a Kubernetes quantity (e.g. "
        "32Gi); shared memory counts against it.",
    )
    shared_memory: Quantity = Field(
        default=DEFAULT_SHARED_MEMORY,
        description="Size of the memory-backed /dev/shm of each worker, as a Kubernetes quantity.",
    )


class RestartPolicy(WireModel):
    """What happens when a worker fails: the whole job restarts from its checkpoint after a backoff."""

    max_restarts: int = Field(
        default=3, ge=0, le=1000, description="Restarts before the job is marked Failed."
    )
    backoff_seconds: int = Field(
        default=10,
        ge=0,
        le=86_400,
        description="Wait before the first restart; doubles on each further restart.",
    )
    non_retryable_exit_codes: NonRetryableExitCodes = Field(default_factory=list)


def _reject_duplicates(values: list[str], field: str) -> None:
    duplicates = sorted({value for value in values if values.count(value) > 1})
    if duplicates:
        raise ValueError(f"{field} must not repeat a value: {', '.join(duplicates)} appears more than once")


VIRTUAL_WORKER_FITS = CelRule(
    rule="!has(self.parallelism.hetpipe) || !has(self.parallelism.hetpipe.virtualWorkerSize)"
    " || self.parallelism.hetpipe.virtualWorkerSize <= self.gpus.max",
    message="parallelism.hetpipe.virtualWorkerSize must be <= gpus.max: a virtual worker cannot have more "
    "GPUs than the job",
    field_path=".parallelism.hetpipe.virtualWorkerSize",
)
SESGD_GROUPS_FIT = CelRule(
    rule="!has(self.parallelism.sesgd) || !has(self.parallelism.sesgd.groups)"
    " || self.parallelism.sesgd.groups <= self.gpus.max",
    message="parallelism.sesgd.groups must be <= gpus.max: every group needs at least one worker",
    field_path=".parallelism.sesgd.groups",
)
BATCH_COVERS_GPUS = CelRule(
    rule="self.batch.global >= self.gpus.min",
    message="batch.global must be >= gpus.min: every GPU needs at least one sample per step",
    field_path=".batch.global",
)
BATCH_LIMITS_NAME_ALLOWED_CLASSES = CelRule(
    rule="!has(self.gpuClasses) || size(self.gpuClasses) == 0 || !has(self.batch.perGpuClassMax)"
    " || self.batch.perGpuClassMax.all(c, c in self.gpuClasses)",
    message="batch.perGpuClassMax may only name classes listed in gpuClasses",
    field_path=".batch.perGpuClassMax",
)
FP16_NEEDS_DATA = CelRule(
    rule="!has(self.precision) || self.precision != 'fp16' || self.parallelism.strategy == 'data'",
    message="precision fp16 needs loss scaling, which only parallelism.strategy data synchronises: use bf16, "
    "fp32 or auto (auto picks fp32 on GPUs without bf16 for the other strategies)",
    field_path=".precision",
)
ADAPTIVE_NEEDS_DATA = CelRule(
    rule="!has(self.batch.adaptive) || !self.batch.adaptive || self.parallelism.strategy == 'data'",
    message="batch.adaptive (a total batch chosen for goodput) is only supported with parallelism.strategy "
    "data, whose workers apply a new total at an epoch boundary: remove batch.adaptive or use strategy data",
    field_path=".batch.adaptive",
    reason="FieldValueForbidden",
)
SPEC_RULES = (
    VIRTUAL_WORKER_FITS,
    SESGD_GROUPS_FIT,
    BATCH_COVERS_GPUS,
    BATCH_LIMITS_NAME_ALLOWED_CLASSES,
    FP16_NEEDS_DATA,
    ADAPTIVE_NEEDS_DATA,
)


WorkloadKeyField = (
    Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)] | None
)


class HeteroTrainJobSpec(WireModel):
    """A training job placed on a mix of GPU types: the operator picks the GPUs, starts one worker pod per
    GPU group and keeps every worker's share of the batch matched to its speed."""

    model_config = ConfigDict(json_schema_extra=cel_rules(*SPEC_RULES))

    image: Annotated[str, StringConstraints(min_length=1, max_length=1024)] = Field(
        description="Container image of the workers; it must contain the heterotrain runtime."
    )
    command: list[BoundedString] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Entrypoint of the worker container."
    )
    args: list[BoundedString] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Arguments to the entrypoint."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=MAX_ENV,
        description="Extra environment variables for every worker. RANK, WORLD_SIZE, MASTER_ADDR and the "
        "plan location are set by the operator.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    workload: WorkloadKeyField = Field(
        default=None,
        description="Throughput-catalog key: jobs with the same key share one WorkloadProfile of measured "
        "speeds per GPU class, which places and splits the next job with the key. Unset: derived from "
        "image, command, args, literal env values and strategy (the image's last path part, then a hash "
        "of them). "
        "Set it when jobs of one model differ only in arguments that do not change its speed.",
    )
    gpus: GpuRange = Field(description="How many GPUs the job may use.")
    gpu_classes: list[ObjectName] = Field(
        default_factory=list,
        max_length=MAX_GPU_CLASSES,
        description="GPUClass names the job may run on, most preferred first. Empty: any class.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    parallelism: Parallelism = Field(
        default_factory=Parallelism, description="How the job is split across its workers."
    )
    batch: Batch = Field(description="Global batch size and how the operator may change it.")
    rebalance: Rebalance = Field(
        default_factory=Rebalance, description="When the operator re-splits the batch between epochs."
    )
    epochs: int = Field(ge=1, le=1_000_000, description="Passes over the training data.")
    checkpoint: Checkpoint | None = Field(
        default=None, description="Checkpointing. Unset: restarts begin from scratch."
    )
    priority: int = Field(
        default=0,
        ge=-1000,
        le=1000,
        description="Higher-priority jobs are placed first; equal priorities run FIFO.",
    )
    queue: Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)] = Field(
        default="default", description="Scheduling queue the job waits in."
    )
    restart_policy: RestartPolicy = Field(
        default_factory=RestartPolicy, description="Restarts after a worker fails."
    )
    suspend: bool = Field(
        default=False,
        description="Stop the job's workers and keep it out of scheduling until set back to false.",
    )
    start_timeout_seconds: StartTimeoutSeconds = None
    active_deadline_seconds: ActiveDeadlineSeconds = None
    ttl_seconds_after_finished: TtlSecondsAfterFinished = None
    precision: Precision = Field(
        default=Precision.AUTO,
        description="Arithmetic of the forward and backward passes, as one contract for the whole job. "
        "auto: each worker picks from its own device (bf16 on a GPU with bf16, such as A100 or H100; fp16 "
        "on one without, such as V100 or T4, under the data strategy, else fp32; fp32 on CPUs), and when "
        "any worker computes in fp16 every worker scales its loss by one job-wide loss scale, so that "
        "the ranks' gradients carry the same scale and an overflow is skipped by every rank together; "
        "hetpipe computes in one format on every worker (bf16 if all have it, else fp32). fp32, bf16 or "
        "fp16 ask every worker for that format (fp16 only under the data strategy). A script of your "
        "own gets this through heterotrain.autocast() and heterotrain.GradScaler().",
    )
    worker_resources: WorkerResources = Field(
        default_factory=WorkerResources,
        description="CPU, memory and shared memory (/dev/shm) of each worker pod beside its GPUs.",
    )
    template: WorkerPodTemplate | None = Field(
        default=None,
        description="What every worker pod adds to the pod the operator builds: labels, annotations, "
        "volumes, init containers, sidecars, tolerations, affinity, imagePullSecrets, priorityClassName and, "
        "in the container named worker, volumeMounts, envFrom, env, ports and resources.",
    )
    pod_overrides: RemovedPodOverrides = Field(
        default=None, description="Removed: refused when set. Use template instead."
    )

    @field_validator("env")
    @classmethod
    def _unique_env_names(cls, env: list[EnvVar]) -> list[EnvVar]:
        _reject_duplicates([variable.name for variable in env], "env[].name")
        return env

    @field_validator("gpu_classes")
    @classmethod
    def _unique_gpu_classes(cls, gpu_classes: list[str]) -> list[str]:
        _reject_duplicates(gpu_classes, "gpuClasses")
        return gpu_classes

    @model_validator(mode="after")
    def _cross_field(self) -> Self:
        hetpipe, sesgd = self.parallelism.hetpipe, self.parallelism.sesgd
        size = hetpipe.virtual_worker_size if hetpipe is not None else None
        if size is not None and size > self.gpus.max:
            raise VIRTUAL_WORKER_FITS.violation(f"got virtualWorkerSize={size}, gpus.max={self.gpus.max}")
        if sesgd is not None and sesgd.groups is not None and sesgd.groups > self.gpus.max:
            raise SESGD_GROUPS_FIT.violation(f"got groups={sesgd.groups}, gpus.max={self.gpus.max}")
        if self.batch.global_batch < self.gpus.min:
            raise BATCH_COVERS_GPUS.violation(
                f"got global={self.batch.global_batch}, gpus.min={self.gpus.min}"
            )
        if self.precision is Precision.FP16 and self.parallelism.strategy is not Strategy.DATA:
            raise FP16_NEEDS_DATA.violation(f"got strategy {self.parallelism.strategy.value}")
        if self.batch.adaptive and self.parallelism.strategy is not Strategy.DATA:
            raise ADAPTIVE_NEEDS_DATA.violation(f"got strategy {self.parallelism.strategy.value}")
        unknown = sorted(set(self.batch.per_gpu_class_max) - set(self.gpu_classes))
        if self.gpu_classes and unknown:
            raise BATCH_LIMITS_NAME_ALLOWED_CLASSES.violation(f"not in gpuClasses: {', '.join(unknown)}")
        return self
