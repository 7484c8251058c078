"""The throughput catalog's one write: a job's measurement of itself goes into its workload's
WorkloadProfile (created on the key's first measurement). What the profile becomes is decided by the
pure `catalog.observe`; the write is conditional on the profile's resourceVersion, so two jobs of one
key measured at once both land (the loser reads again)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from hetero_operator.controller.catalog import DEFAULT_HALF_LIFE_HOURS, observe, workload_key
from hetero_operator.controller.k8s import HETEROTRAIN, KubeError
from hetero_operator.resources import GROUP, VERSION, HeteroTrainJob, InvalidResourceError, MeasuredProfile
from hetero_operator.resources.objects import WorkloadProfile

log = logging.getLogger("heterotrain.catalog")

PROFILES = f"{HETEROTRAIN}/{WorkloadProfile.PLURAL}"
ATTEMPTS = 3  # conditional writes before giving up until the job's next measurement


class ProfileClient(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def create(self, manifest: Mapping[str, Any]) -> bool: ...


def profile_manifest(key: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "WorkloadProfile",
        "metadata": {"name": key, "labels": {"app.kubernetes.io/managed-by": "heterotrain"}},
        "spec": {"workload": key},
    }


async def record_measurement(
    client: ProfileClient,
    job: HeteroTrainJob,
    measured: MeasuredProfile,
    now: float,
    half_life_hours: float = DEFAULT_HALF_LIFE_HOURS,
) -> bool:
    """Put the job's measurement into its workload's profile; False when it could not (logged: the
    job's next measurement tries again, and nothing of the job depends on it)."""
    key = workload_key(job.spec)
    path = f"{PROFILES}/{key}"
    at = datetime.fromtimestamp(now, UTC).replace(microsecond=0)
    try:
        for _ in range(ATTEMPTS):
            body = await client.get(path)
            if body is None:
                await client.create(profile_manifest(key))
                body = await client.get(path)
                if body is None:
                    continue
            profile = WorkloadProfile.from_k8s(body)
            status = observe(profile.status, f"{job.namespace}/{job.name}", measured, at, half_life_hours)
            version = (body.get("metadata") or {}).get("resourceVersion")
            patch = {"metadata": {"resourceVersion": version}, "status": status.to_wire()}
            try:
                await client.merge_patch(f"{path}/status", patch)
                return True
            except KubeError as error:
                if error.status != 409:
                    raise
    except (KubeError, InvalidResourceError) as error:
        log.warning("%s/%s: workload profile %s not updated: %s", job.namespace, job.name, key, error)
        return False
    log.warning("%s/%s: workload profile %s not updated: it kept changing", job.namespace, job.name, key)
    return False


async def record_published(
    client: ProfileClient, job: HeteroTrainJob, patch: Mapping[str, Any], now: float
) -> None:
    """Record the measurement a status patch of the rebalancer carries, if it carries one."""
    if "measured" in patch:
        await record_measurement(client, job, MeasuredProfile.model_validate(patch["measured"]), now)
