"""`GPUClass` (cluster-scoped): a kind of GPU, the nodes that have it, and a prior on its speed."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StringConstraints

from hetero_operator.resources.base import MAX_NAME_LENGTH, LabelValue, WireModel

MAX_SELECTOR_LABELS = 16
MAX_TOLERATIONS = 32
# A Kubernetes qualified name with an optional DNS prefix, as used for extended resources.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

ResourceName = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_NAME_LENGTH + 64, pattern=QUALIFIED_NAME_PATTERN)
]


class GPUClassSpec(WireModel):
    """A kind of GPU: which nodes have it, how much memory it has and how fast it is expected to be.
    A job whose workload has run on the class goes by its WorkloadProfile's measured speed instead."""

    node_selector: dict[str, LabelValue] = Field(
        min_length=1,
        max_length=MAX_SELECTOR_LABELS,
        description="Node labels that identify nodes with this GPU, for example "
        "nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB.",
    )
    resource_name: ResourceName = Field(
        default="nvidia.com/gpu",
        description="Extended resource that counts these GPUs in node capacity and pod limits.",
    )
    memory_gib: float = Field(
        alias="memoryGiB", gt=0, le=4096, description="Memory of one GPU in GiB; bounds local batch sizes."
    )
    relative_speed: float = Field(
        gt=0,
        le=1000,
        description="Prior throughput relative to a reference GPU (1.0 = reference, 0.5 = half as fast), "
        "used for a job until it or its workload (WorkloadProfile) has measured the class.",
    )
    cost_weight: float = Field(
        default=1.0,
        ge=0,
        le=1_000_000,
        description="Relative cost of one GPU-hour, for cost-aware placement.",
    )
    tolerations: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=MAX_TOLERATIONS,
        description="Kubernetes tolerations added to every worker pod on this class's nodes. Nodes whose "
        "NoSchedule or NoExecute taints these do not tolerate are left out of scheduling.",
    )


class GPUClassStatus(WireModel):
    """What the operator last counted for this class."""

    nodes: int = Field(
        default=0,
        ge=0,
        description="Ready, schedulable nodes matching nodeSelector whose taints the class tolerates.",
    )
    gpus: int = Field(default=0, ge=0, description="Allocatable GPUs on those nodes.")
    free_gpus: int = Field(default=0, ge=0, description="Of those GPUs, the ones no running pod requests.")
    measured_speed: float | None = Field(
        default=None,
        ge=0,
        description="Measured speed on relativeSpeed's scale, from the throughput catalog: each "
        "WorkloadProfile whose estimate covers this class and at least one other rates the class by its "
        "samples/s of compute here over its samples/s on each other class, times that class's "
        "relativeSpeed (geometric mean over those classes); the median over workloads. This class's own "
        "prior is not used, so a value far from relativeSpeed says the prior is off. Absent until such a "
        "workload exists.",
    )
    measured_workloads: int = Field(
        default=0,
        ge=0,
        description="Workloads (WorkloadProfiles) over which measuredSpeed is the median.",
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation of the spec the status reflects."
    )
