"""The `heterotrain.io/v1alpha1` API: pydantic models that are the single source of truth for the CRDs.

Import-light (pydantic only), so the runtime and the planner may use these models too.
"""

from hetero_operator.resources.base import API_VERSION, GROUP, VERSION, CelRule, InvalidResourceError
from hetero_operator.resources.checkpoint_storage import CheckpointAccessMode, CheckpointStorage
from hetero_operator.resources.gpuclass import GPUClassSpec, GPUClassStatus
from hetero_operator.resources.job_spec import (
    Batch,
    Checkpoint,
    EnvVar,
    GpuRange,
    HeteroTrainJobSpec,
    Rebalance,
    RestartPolicy,
    WorkerResources,
)
from hetero_operator.resources.job_status import (
    Allocation,
    ClassWait,
    Condition,
    ConditionStatus,
    HeteroTrainJobStatus,
    MeasuredClass,
    MeasuredProfile,
    NodeExclusion,
    Phase,
    Plan,
    Progress,
    RebalanceRecord,
    Waiting,
    WorkerAllocation,
)
from hetero_operator.resources.objects import GPUClass, HeteroQueue, HeteroTrainJob, WorkloadProfile
from hetero_operator.resources.parallelism import (
    AllocationPolicy,
    DreamDDPParameters,
    ESyncParameters,
    HetPipeParameters,
    Parallelism,
    SESGDParameters,
    Strategy,
)
from hetero_operator.resources.queue import ClassQuotaSpec, ClassUsage, HeteroQueueSpec, HeteroQueueStatus

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Allocation",
    "AllocationPolicy",
    "Batch",
    "CelRule",
    "Checkpoint",
    "CheckpointAccessMode",
    "CheckpointStorage",
    "ClassQuotaSpec",
    "ClassUsage",
    "ClassWait",
    "Condition",
    "ConditionStatus",
    "DreamDDPParameters",
    "ESyncParameters",
    "EnvVar",
    "GPUClass",
    "GPUClassSpec",
    "GPUClassStatus",
    "GpuRange",
    "HetPipeParameters",
    "HeteroQueue",
    "HeteroQueueSpec",
    "HeteroQueueStatus",
    "HeteroTrainJob",
    "HeteroTrainJobSpec",
    "HeteroTrainJobStatus",
    "InvalidResourceError",
    "MeasuredClass",
    "MeasuredProfile",
    "NodeExclusion",
    "Parallelism",
    "Phase",
    "Plan",
    "Progress",
    "Rebalance",
    "RebalanceRecord",
    "RestartPolicy",
    "SESGDParameters",
    "Strategy",
    "Waiting",
    "WorkerAllocation",
    "WorkerResources",
    "WorkloadProfile",
]
