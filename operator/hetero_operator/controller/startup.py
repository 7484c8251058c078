"""Before the first cycle: wait until the watches hold everything that existed at start. Deciding on
a partial view could place a job twice or hand out GPUs that are taken."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from hetero_operator.controller import names
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.k8s import CORE, HETEROTRAIN, KUEUE, KubeClient, KubeError
from hetero_operator.resources import HeteroQueue, InvalidResourceError

log = logging.getLogger(__name__)
RELIST_SECONDS = 1.0  # while waiting, how often to list again what still exists


@dataclass(frozen=True)
class Existing:
    """Keys ("namespace/name", or the name) of what exists at start."""

    jobs: set[str]
    pods: set[str]
    nodes: set[str]
    workloads: set[str] = field(default_factory=set)
    # Valid HeteroQueues: a first cycle without them would place jobs beyond their quotas.
    queues: set[str] = field(default_factory=set)


def _key(item: Mapping[str, Any]) -> str:
    return f"{item['metadata']['namespace']}/{item['metadata']['name']}"


async def existing_objects(client: KubeClient, namespaces: tuple[str, ...], kueue: bool = False) -> Existing:
    """The jobs, worker pods and nodes that exist now, and the jobs' Kueue Workloads (`kueue`)."""
    scopes = [f"/namespaces/{ns}" for ns in namespaces] or [""]
    found = Existing(set(), set(), set())
    selector = {"labelSelector": names.LABEL_JOB}
    managed = {"labelSelector": f"{names.LABEL_MANAGED_BY}={names.MANAGED_BY}"}
    for scope in scopes:
        found.jobs.update(_key(i) for i in await client.list_items(f"{HETEROTRAIN}{scope}/heterotrainjobs"))
        found.pods.update(_key(i) for i in await client.list_items(f"{CORE}{scope}/pods", selector))
        if kueue:
            found.workloads.update(
                _key(i) for i in await client.list_items(f"{KUEUE}{scope}/workloads", managed)
            )
    found.nodes.update(item["metadata"]["name"] for item in await client.list_items(f"{CORE}/nodes"))
    try:
        queues = await client.list_items(f"{HETEROTRAIN}/heteroqueues")
    except KubeError as error:
        if error.status != 404:  # a cluster without the HeteroQueue CRD has no queues
            raise
        queues = []
    for item in queues:
        with contextlib.suppress(InvalidResourceError):  # the index leaves invalid queues out too
            found.queues.add(HeteroQueue.from_k8s(item).name)
    return found


def still_there(existing: Existing, now: Existing) -> Existing:
    """What existed at start and exists still. An object deleted while the watches started never
    reaches (or leaves) the indexes, so waiting for it would wait for the whole timeout."""
    return Existing(
        existing.jobs & now.jobs,
        existing.pods & now.pods,
        existing.nodes & now.nodes,
        existing.workloads & now.workloads,
    )


def holds_everything(view: ClusterView, existing: Existing) -> bool:
    seen_pods = {f"{p.namespace}/{p.name}" for p in view.all_pods()}
    seen_workloads = {f"{w.namespace}/{w.name}" for found in view.kueue.workloads.values() for w in found}
    return (
        existing.jobs <= set(view.jobs)
        and existing.pods <= seen_pods
        and existing.nodes <= set(view.nodes)
        and existing.workloads <= seen_workloads
        and existing.queues <= set(view.queues)
    )


async def wait_for_indexes(
    client: KubeClient,
    view: Callable[[], ClusterView],
    namespaces: tuple[str, ...],
    clock: Clock,
    timeout: float = 60.0,
    kueue: bool = False,
) -> None:
    deadline = clock.monotonic() + timeout
    while True:
        try:
            existing = await existing_objects(client, namespaces, kueue)
            break
        except (KubeError, aiohttp.ClientError) as error:
            if clock.monotonic() > deadline:
                raise
            log.info("listing the cluster failed (%s); retrying", error)
            await clock.sleep(0.5)
    listed = clock.monotonic()
    while clock.monotonic() < deadline:
        if clock.monotonic() - listed >= RELIST_SECONDS:
            # Objects deleted since the first listing (a restart amid deletions) are not waited for.
            with contextlib.suppress(KubeError, aiohttp.ClientError):
                existing = still_there(existing, await existing_objects(client, namespaces, kueue))
            listed = clock.monotonic()
        if holds_everything(view(), existing):
            log.info(
                "indexes ready: %d jobs, %d pods, %d nodes, %d Workloads",
                len(existing.jobs),
                len(existing.pods),
                len(existing.nodes),
                len(existing.workloads),
            )
            return
        await clock.sleep(0.1)
    log.warning("indexes incomplete after %.0f s; starting anyway", timeout)
