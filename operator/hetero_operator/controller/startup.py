"""Before the first cycle: wait until the watches hold everything that existed at start. Deciding on
a partial view could place a job twice or hand out GPUs that are taken."""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp

from hetero_operator.controller import names
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.k8s import CORE, HETEROTRAIN, KubeClient, KubeError

log = logging.getLogger(__name__)


async def existing_objects(
    client: KubeClient, namespaces: tuple[str, ...]
) -> tuple[set[str], set[str], set[str]]:
    """Keys of the jobs, worker pods and nodes that exist now."""
    scopes = [f"/namespaces/{ns}" for ns in namespaces] or [""]
    jobs: set[str] = set()
    pods: set[str] = set()
    for scope in scopes:
        for item in await client.list_items(f"{HETEROTRAIN}{scope}/heterotrainjobs"):
            jobs.add(f"{item['metadata']['namespace']}/{item['metadata']['name']}")
        selector = {"labelSelector": names.LABEL_JOB}
        for item in await client.list_items(f"{CORE}{scope}/pods", selector):
            pods.add(f"{item['metadata']['namespace']}/{item['metadata']['name']}")
    nodes = {item["metadata"]["name"] for item in await client.list_items(f"{CORE}/nodes")}
    return jobs, pods, nodes


def holds_everything(view: ClusterView, jobs: set[str], pods: set[str], nodes: set[str]) -> bool:
    seen_pods = {f"{p.namespace}/{p.name}" for p in view.all_pods()}
    return jobs <= set(view.jobs) and pods <= seen_pods and nodes <= set(view.nodes)


async def wait_for_indexes(
    client: KubeClient,
    view: Callable[[], ClusterView],
    namespaces: tuple[str, ...],
    clock: Clock,
    timeout: float = 60.0,
) -> None:
    deadline = clock.monotonic() + timeout
    while True:
        try:
            jobs, pods, nodes = await existing_objects(client, namespaces)
            break
        except (KubeError, aiohttp.ClientError) as error:
            if clock.monotonic() > deadline:
                raise
            log.info("listing the cluster failed (%s); retrying", error)
            await clock.sleep(0.5)
    while clock.monotonic() < deadline:
        if holds_everything(view(), jobs, pods, nodes):
            log.info("indexes ready: %d jobs, %d pods, %d nodes", len(jobs), len(pods), len(nodes))
            return
        await clock.sleep(0.1)
    log.warning("indexes incomplete after %.0f s; starting anyway", timeout)
