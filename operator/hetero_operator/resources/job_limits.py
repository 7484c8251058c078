"""Time limits of a `HeteroTrainJob` and the spec fields that cannot change under running workers.

The time limits are plain fields of the spec (as on a Kubernetes Job). The immutability rules are CEL
transition rules on the whole object: they compare the new spec with the stored one (`oldSelf`) and
read the stored phase, so a field is frozen only while the job holds GPUs (Starting, Running,
Restarting) and can be changed again once the job is Suspended or queued. A model sees one object
only, so these rules have no model-validator twin: the API server alone enforces them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from hetero_operator.resources.base import CelRule

MAX_LIMIT_SECONDS = 31_536_000  # a year
MAX_NON_RETRYABLE_EXIT_CODES = 32

StartTimeoutSeconds = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_LIMIT_SECONDS,
        description="Seconds every worker pod of a start (counted from the creation of that start's pods) "
        "has to reach Running. A pod still not Running then (for example waiting in ErrImagePull or "
        "CreateContainerConfigError) stops the start: its pods are deleted, the GPUs released and the job "
        "queued again after the restart backoff, counting a restart; Failed once restartPolicy.maxRestarts "
        "is used up. Unset: the operator's default (lifecycle.startTimeoutSeconds).",
    ),
]
ActiveDeadlineSeconds = Annotated[
    int | None,
    Field(
        ge=1,
        le=MAX_LIMIT_SECONDS,
        description="Seconds the job may take, counted from its first start (status.startedAt: when it "
        "was first placed on GPUs, so time spent queued before that does not count; time after it does, "
        "restarts, waits to be placed again and suspensions included). Then the job is Failed with "
        "reason DeadlineExceeded and its workers are deleted. Unset: no limit.",
    ),
]
TtlSecondsAfterFinished = Annotated[
    int | None,
    Field(
        ge=0,
        le=MAX_LIMIT_SECONDS,
        description="Delete the job (and the objects it owns) this many seconds after it Succeeded or "
        "Failed (status.finishedAt). Unset: the job is kept until deleted.",
    ),
]
ExitCode = Annotated[int, Field(ge=1, le=255)]
NonRetryableExitCodes = Annotated[
    list[ExitCode],
    Field(
        max_length=MAX_NON_RETRYABLE_EXIT_CODES,
        description="Exit codes of a worker that mean a restart cannot help (for example a bad argument): "
        "a worker ending with one fails the job at once, whatever restarts are left.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    ),
]

# Phases in which workers exist (or are about to): the status a transition rule reads.
PHASES_HOLDING_GPUS = ("Starting", "Running", "Restarting")

# Spec fields baked into the workers' pods or their training state; every other field (gpus,
# gpuClasses, batch, priority, queue, suspend, restartPolicy, the time limits, ...) stays mutable.
FIELDS_FIXED_WHILE_RUNNING = (
    "image",
    "command",
    "args",
    "env",
    "parallelism",
    "precision",
    "checkpoint",
    "workerResources",
    "template",
)


def _fixed_while_running(field: str) -> CelRule:
    phases = ", ".join(f"'{phase}'" for phase in PHASES_HOLDING_GPUS)
    unchanged = (
        f"(has(self.spec.{field}) ? has(oldSelf.spec.{field}) && self.spec.{field} == oldSelf.spec.{field}"
        f" : !has(oldSelf.spec.{field}))"
    )
    running = f"has(oldSelf.status) && has(oldSelf.status.phase) && oldSelf.status.phase in [{phases}]"
    return CelRule(
        rule=f"!({running}) || {unchanged}",
        message=f"spec.{field} cannot change while the job's workers run (phase Starting, Running or "
        f"Restarting): set spec.suspend to true and change it once the job is Suspended, or delete and "
        f"recreate the job",
        field_path=f".spec.{field}",
        reason="FieldValueForbidden",
    )


IMMUTABLE_WHILE_RUNNING = tuple(_fixed_while_running(field) for field in FIELDS_FIXED_WHILE_RUNNING)
