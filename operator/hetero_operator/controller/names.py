"""Names, labels and annotations the operator puts on the objects it owns."""

from __future__ import annotations

from hetero_operator import plan as plan_contract
from hetero_operator.resources import pod_template

GROUP = "heterotrain.io"
FINALIZER = f"{GROUP}/cleanup"  # the scheduling loop's: a deleted job's objects go first
# kopf's own: it would add it for daemons or deletion handlers, and this operator registers neither
# (the scheduling loop runs the rebalancers), so no job carries it.
KOPF_FINALIZER = f"{GROUP}/kopf"

LABEL_JOB = f"{GROUP}/job"
LABEL_RANK = f"{GROUP}/rank"
LABEL_GENERATION = f"{GROUP}/generation"
LABEL_GPU_CLASS = f"{GROUP}/gpu-class"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "heterotrain-operator"

# Part of the contract with the runtime, which watches for it: defined beside the plan.
CHECKPOINT_REQUESTED_ANNOTATION = plan_contract.CHECKPOINT_REQUESTED_ANNOTATION
PODINFO_MOUNT_DIR = pod_template.PODINFO_MOUNT_DIR
"""Where a worker pod's annotations appear (a Downward API volume the kubelet keeps up to date)."""
PODINFO_ANNOTATIONS_FILE = "annotations"

WORKER_CONTAINER = pod_template.WORKER_CONTAINER
PLAN_MOUNT_DIR = pod_template.PLAN_MOUNT_DIR
DEFAULT_MASTER_PORT = 29500
MAX_JOB_NAME_LENGTH = 52
"""A job's name becomes its headless Service name (a DNS label of at most 63 characters) and the
prefix of its pod names; 52 leaves room for the suffixes."""


def pod_name(job: str, generation: int, rank: int) -> str:
    """Deterministic worker pod name: a repeated reconcile creates the same pod, never a second one."""
    return f"{job}-g{generation}-w{rank}"


def pod_hostname(generation: int, rank: int) -> str:
    return f"g{generation}-w{rank}"


def service_name(job: str) -> str:
    return job


def plan_config_map_name(job: str) -> str:
    return f"{job}-plan"


def checkpoint_claim_name(job: str) -> str:
    return f"{job}-checkpoint"


def job_selector(job: str) -> str:
    """Label selector of every object the operator created for one job."""
    return f"{LABEL_JOB}={job}"


def job_objects(job: str) -> tuple[tuple[str, str], ...]:
    """(kind, name) of the objects one job owns besides its pods."""
    return (
        ("Service", service_name(job)),
        ("ConfigMap", plan_config_map_name(job)),
        ("PersistentVolumeClaim", checkpoint_claim_name(job)),
    )
