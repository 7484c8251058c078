"""Status changes of a Kueue Workload, written as Kueue's job integrations write them: built from the
Workload as it is now, applied server-side as Kueue's admission field manager (forced), and built
again from a fresh read when Kueue wrote the Workload meanwhile (409)."""

from __future__ import annotations

from datetime import UTC, datetime

from hetero_operator.controller.actions import PatchWorkloadStatus
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.k8s import KubeClient, KubeError, path_of
from hetero_operator.kueue.constants import ADMISSION_FIELD_MANAGER
from hetero_operator.kueue.status_patch import due_patch

ATTEMPTS = 5


async def change_workload_status(
    client: KubeClient, clock: Clock, namespace: str, action: PatchWorkloadStatus
) -> bool:
    """Apply `action` to the Workload; False when there was nothing left to do (it is gone, or
    the change was made already)."""
    path = path_of("Workload", namespace, action.name)
    for _ in range(ATTEMPTS):
        body = await client.get(path)
        if body is None:
            return False
        now = datetime.fromtimestamp(clock.time(), UTC)
        patch = due_patch(action.change, body, now, action.succeeded, action.message)
        if patch is None:
            return False
        try:
            return await client.apply(f"{path}/status", patch, ADMISSION_FIELD_MANAGER) is not None
        except KubeError as error:
            if error.status != 409:
                raise
    raise KubeError(409, "PATCH", path, f"the Workload changed under every one of {ATTEMPTS} attempts")
