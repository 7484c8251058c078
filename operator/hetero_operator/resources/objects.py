"""The custom resources as whole Kubernetes objects, with parsing from and to API dictionaries."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Self

from pydantic import ConfigDict, Field, ValidationError

from hetero_operator.resources.base import (
    API_VERSION,
    InvalidResourceError,
    WireModel,
    cel_rules,
    describe_errors,
)
from hetero_operator.resources.gpuclass import GPUClassSpec, GPUClassStatus
from hetero_operator.resources.job_limits import IMMUTABLE_WHILE_RUNNING
from hetero_operator.resources.job_spec import HeteroTrainJobSpec
from hetero_operator.resources.job_status import HeteroTrainJobStatus
from hetero_operator.resources.queue import HeteroQueueSpec, HeteroQueueStatus
from hetero_operator.resources.workload_profile import WorkloadProfileSpec, WorkloadProfileStatus


class _CustomObject(WireModel):
    """apiVersion, kind and metadata shared by both resources. metadata stays a plain dictionary: the API
    server owns its schema and the operator only reads a few keys."""

    PLURAL: ClassVar[str]
    SHORT_NAMES: ClassVar[tuple[str, ...]] = ()
    NAMESPACED: ClassVar[bool]

    api_version: Literal["heterotrain.io/v1alpha1"] = Field(
        default="heterotrain.io/v1alpha1", description=API_VERSION
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")

    @classmethod
    def from_k8s(cls, obj: dict[str, Any]) -> Self:
        """Parse an object as the API server or a manifest gives it.

        Raises InvalidResourceError with one `spec.field: problem` line per error."""
        try:
            return cls.model_validate(obj)
        except ValidationError as error:
            name = str((obj.get("metadata") or {}).get("name", "")) if isinstance(obj, dict) else ""
            raise InvalidResourceError(cls.__name__, name, describe_errors(error)) from error

    def to_k8s(self) -> dict[str, Any]:
        """The object as a Kubernetes API dictionary (camelCase, unset optional fields left out)."""
        return self.to_wire()

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def generation(self) -> int | None:
        generation = self.metadata.get("generation")
        return int(generation) if generation is not None else None


class HeteroTrainJob(_CustomObject):
    """A training job on a heterogeneous GPU pool."""

    # Transition rules on the whole object: they read the stored phase beside the spec.
    model_config = ConfigDict(json_schema_extra=cel_rules(*IMMUTABLE_WHILE_RUNNING))
    PLURAL = "heterotrainjobs"
    SHORT_NAMES = ("htj",)
    NAMESPACED = True

    kind: Literal["HeteroTrainJob"] = Field(default="HeteroTrainJob", description="HeteroTrainJob")
    spec: HeteroTrainJobSpec
    status: HeteroTrainJobStatus | None = None

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace", ""))


class GPUClass(_CustomObject):
    """A kind of GPU in the cluster."""

    PLURAL = "gpuclasses"
    NAMESPACED = False

    kind: Literal["GPUClass"] = Field(default="GPUClass", description="GPUClass")
    spec: GPUClassSpec
    status: GPUClassStatus | None = None


class HeteroQueue(_CustomObject):
    """A queue that jobs name in spec.queue: weight, GPU quotas per class, cohort."""

    PLURAL = "heteroqueues"
    SHORT_NAMES = ("hq",)
    NAMESPACED = False

    kind: Literal["HeteroQueue"] = Field(default="HeteroQueue", description="HeteroQueue")
    spec: HeteroQueueSpec
    status: HeteroQueueStatus | None = None


class WorkloadProfile(_CustomObject):
    """The throughput catalog's entry for one workload key: written by the operator, read by its
    scheduler and first plans."""

    PLURAL = "workloadprofiles"
    SHORT_NAMES = ("wlp",)
    NAMESPACED = False

    kind: Literal["WorkloadProfile"] = Field(default="WorkloadProfile", description="WorkloadProfile")
    spec: WorkloadProfileSpec
    status: WorkloadProfileStatus | None = None
