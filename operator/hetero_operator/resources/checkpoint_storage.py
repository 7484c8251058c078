"""`spec.checkpoint.storage`: the volume that holds a job's checkpoints, as a cluster can provide it.

Either the operator creates a claim per job (storage class, size and access mode, each defaulting to
the operator's `launch` settings) or the job names a claim that already exists. With ReadWriteOnce
only rank 0 mounts the volume: it writes the checkpoints, and on a resume it reads the newest one and
sends it to the other ranks over the process group.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, model_validator

from hetero_operator.resources.base import CelRule, ObjectName, Quantity, WireModel, cel_rules


class CheckpointAccessMode(StrEnum):
    """How the checkpoint volume is mounted: on every worker, or on rank 0's pod only."""

    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE = "ReadWriteOnce"


EXISTING_CLAIM_EXCLUDES_CLASS = CelRule(
    rule="!has(self.existingClaim) || !has(self.storageClassName)",
    message="checkpoint.storage.storageClassName describes a claim the operator creates, and "
    "existingClaim names one it does not: remove one of them",
    field_path=".storageClassName",
    reason="FieldValueForbidden",
)
EXISTING_CLAIM_EXCLUDES_SIZE = CelRule(
    rule="!has(self.existingClaim) || !has(self.size)",
    message="checkpoint.storage.size describes a claim the operator creates, and existingClaim names "
    "one it does not: remove one of them",
    field_path=".size",
    reason="FieldValueForbidden",
)
STORAGE_NEEDS_DIRECTORY = CelRule(
    rule="!has(self.storage) || self.path.startsWith('/')",
    message="checkpoint.storage needs checkpoint.path to be a directory (an absolute path such as "
    "/checkpoints) to mount it at: make the path absolute or remove checkpoint.storage",
    field_path=".storage",
    reason="FieldValueForbidden",
)


class CheckpointStorage(WireModel):
    """The volume mounted at checkpoint.path. Unset fields take the operator's defaults (the chart's
    `operator.settings.launch` values)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(EXISTING_CLAIM_EXCLUDES_CLASS, EXISTING_CLAIM_EXCLUDES_SIZE)
    )

    storage_class_name: ObjectName | None = Field(
        default=None,
        description="StorageClass of the claim the operator creates. Default: the operator's "
        "launch.checkpointStorageClass, else the cluster's default StorageClass.",
    )
    access_mode: CheckpointAccessMode | None = Field(
        default=None,
        description="ReadWriteMany: every worker mounts the volume. ReadWriteOnce: only rank 0 mounts it; "
        "rank 0 writes the checkpoints and, on a resume, sends the newest to the other ranks. Default: "
        "the operator's launch.checkpointAccessMode. With existingClaim, the mode that claim allows.",
    )
    size: Quantity | None = Field(
        default=None,
        description="Storage the claim the operator creates requests, e.g. 50Gi. Default: the "
        "operator's launch.checkpointStorage.",
    )
    existing_claim: ObjectName | None = Field(
        default=None,
        description="A PersistentVolumeClaim in the job's namespace to mount instead of creating one; "
        "the operator never deletes it.",
    )

    @model_validator(mode="after")
    def _existing_claim_alone(self) -> Self:
        if self.existing_claim is not None and self.storage_class_name is not None:
            raise EXISTING_CLAIM_EXCLUDES_CLASS.violation(
                f"existingClaim={self.existing_claim!r}, storageClassName={self.storage_class_name!r}"
            )
        if self.existing_claim is not None and self.size is not None:
            raise EXISTING_CLAIM_EXCLUDES_SIZE.violation(
                f"existingClaim={self.existing_claim!r}, size={self.size!r}"
            )
        return self
