"""Which volume holds a job's checkpoints and which of its workers mount it: the job's
`spec.checkpoint.storage` over the operator's defaults (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_operator.controller import names
from hetero_operator.resources import Checkpoint, CheckpointAccessMode, CheckpointStorage

VOLUME_NAME = "checkpoint"


@dataclass(frozen=True, slots=True)
class CheckpointVolume:
    """The claim mounted at the checkpoint path. `owned`: the operator creates it (owned by the job,
    so it is deleted with the job); otherwise it is the user's existing claim and is left alone."""

    claim_name: str
    access_mode: CheckpointAccessMode
    owned: bool
    storage_class: str | None = None
    size: str | None = None

    @property
    def rank0_only(self) -> bool:
        """A ReadWriteOnce volume may be attached to one node, so only rank 0 mounts it."""
        return self.access_mode is CheckpointAccessMode.READ_WRITE_ONCE

    def mounted_on(self, rank: int) -> bool:
        return not self.rank0_only or rank == 0


def resolve(
    job_name: str, checkpoint: Checkpoint | None, defaults: CheckpointStorage
) -> CheckpointVolume | None:
    """The job's checkpoint volume; None when it has no checkpoint directory (a URL the script handles
    itself needs no volume)."""
    if checkpoint is None or not checkpoint.path.startswith("/"):
        return None
    storage = checkpoint.storage or CheckpointStorage()
    mode = storage.access_mode or defaults.access_mode or CheckpointAccessMode.READ_WRITE_MANY
    if storage.existing_claim is not None:
        return CheckpointVolume(storage.existing_claim, mode, owned=False)
    return CheckpointVolume(
        names.checkpoint_claim_name(job_name),
        mode,
        owned=True,
        storage_class=storage.storage_class_name or defaults.storage_class_name,
        size=storage.size or defaults.size,
    )


def claim_spec(volume: CheckpointVolume) -> dict[str, Any]:
    """The spec of a claim the operator creates; no storageClassName means the cluster's default."""
    spec: dict[str, Any] = {
        "accessModes": [volume.access_mode.value],
        "resources": {"requests": {"storage": volume.size}},
    }
    if volume.storage_class is not None:
        spec["storageClassName"] = volume.storage_class
    return spec


def pod_volume(volume: CheckpointVolume) -> dict[str, Any]:
    return {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": volume.claim_name}}


def container_mount(path: str) -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": path}
