"""Two writers share `status.conditions`: the scheduling loop and the rebalancer. A JSON merge patch
replaces the whole list, so each writer sends its own condition types together with the other's as
the API server has them, under a resourceVersion precondition: on a conflict it reads the job again
and retries, and neither writer ever drops the other's conditions.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hetero_operator.controller.job_conditions import REBALANCER_TYPES
from hetero_operator.controller.k8s import KubeError

ATTEMPTS = 5


class StatusClient(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...


def owned_by_rebalancer(condition_type: str) -> bool:
    return condition_type in REBALANCER_TYPES


def owned_by_loop(condition_type: str) -> bool:
    return condition_type not in REBALANCER_TYPES


def merged_conditions(
    mine: list[dict[str, Any]], current: Mapping[str, Any], owned: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """The other writer's conditions as `current` (a job body) has them, then this writer's own."""
    theirs = [
        c for c in (current.get("status") or {}).get("conditions") or [] if not owned(c.get("type", ""))
    ]
    return [*theirs, *(c for c in mine if owned(c.get("type", "")))]


async def patch_status(
    client: StatusClient,
    path: str,
    status_patch: Mapping[str, Any],
    owned: Callable[[str], bool],
    known: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Merge-patch `status_patch` into the job's status (`path` ends in /status). When it carries
    `conditions`, only the `owned` types are this writer's; `known` is the freshest body the caller
    has (saves a read when nobody wrote since). None: the job is gone."""
    if "conditions" not in status_patch:
        return await client.merge_patch(path, {"status": dict(status_patch)})
    mine = list(status_patch["conditions"])
    current = known
    for _ in range(ATTEMPTS):
        if current is None:
            current = await client.get(path)
            if current is None:
                return None
        body = {
            "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
            "status": {**status_patch, "conditions": merged_conditions(mine, current, owned)},
        }
        try:
            return await client.merge_patch(path, body)
        except KubeError as error:
            if error.status != 409:
                raise
            current = None  # someone wrote meanwhile: read again
    raise KubeError(409, "PATCH", path, f"the status changed under every one of {ATTEMPTS} attempts")
