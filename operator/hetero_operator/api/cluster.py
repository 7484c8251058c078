"""The cluster as the operator sees it, read straight from the API server.

The same parsing (`facts`), view (`ClusterView`) and snapshot builder (`build_snapshot`, `job_request`,
`scheduling_role`) the operator's scheduling loop uses, fed by list calls instead of kopf's
indexes, so the API and the CLI answer with the operator's own picture without sharing its memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from hetero_operator.api.kube import KubeReader
from hetero_operator.controller.catalog import estimates, valid_profiles
from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, PodFacts
from hetero_operator.controller.inventory import ClusterView, build_snapshot, job_request
from hetero_operator.controller.lifecycle import Role, scheduling_role
from hetero_operator.resources import GPUClass, HeteroTrainJobStatus, InvalidResourceError
from hetero_operator.scheduler import JobRequest, Snapshot

log = logging.getLogger(__name__)


def class_facts(bodies: Iterable[Mapping[str, Any]]) -> list[ClassFacts]:
    """Valid GPUClasses; an invalid one is skipped (the operator skips it too)."""
    facts = []
    for body in bodies:
        try:
            facts.append(ClassFacts.from_model(GPUClass.from_k8s(dict(body))))
        except InvalidResourceError as error:
            log.warning("GPUClass %s skipped: %s", error.name, "; ".join(error.problems))
    return facts


def view_from_bodies(
    classes: Iterable[Mapping[str, Any]],
    nodes: Iterable[Mapping[str, Any]],
    jobs: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    profiles: Iterable[Mapping[str, Any]] = (),
) -> ClusterView:
    return ClusterView.build(
        class_facts(classes),
        (NodeFacts.from_body(body) for body in nodes),
        (JobFacts.from_body(body) for body in jobs),
        (PodFacts.from_body(body) for body in pods),
        profiles=estimates(valid_profiles(profiles)),
    )


async def _nothing() -> list[dict[str, Any]]:
    return []


async def read_view(kube: KubeReader, catalog: bool = True) -> ClusterView:
    """GPUClasses, nodes, every HeteroTrainJob, every live pod and (`catalog`) the throughput
    catalog, read concurrently."""
    profiles = kube.workload_profiles() if catalog else _nothing()
    classes, nodes, jobs, pods, profile_bodies = await asyncio.gather(
        kube.gpu_classes(), kube.nodes(), kube.jobs(), kube.live_pods(), profiles
    )
    return view_from_bodies(classes, nodes, jobs, pods, profile_bodies)


def job_requests(view: ClusterView) -> list[JobRequest]:
    """What the scheduler would see of each job: queued jobs want GPUs, placed jobs hold theirs.

    Read-only: the stored status is taken as it is (no lifecycle step runs). A job holding GPUs on a
    lost node is left out, as the operator leaves it out, so its pods count as used by others."""
    requests = []
    for key, facts in sorted(view.jobs.items()):
        if facts.deleting or facts.model is None:
            continue
        status = facts.model.status or HeteroTrainJobStatus()
        role = scheduling_role(facts.model, status, view.pods_of(key))
        catalog = view.workload_estimate(facts.model)
        if role is Role.QUEUED:
            requests.append(job_request(facts, facts.model, status, holding=False, catalog=catalog))
        elif role is Role.HOLDING and not _off_snapshot(view, status):
            requests.append(job_request(facts, facts.model, status, holding=True, catalog=catalog))
    return requests


def _off_snapshot(view: ClusterView, status: HeteroTrainJobStatus) -> bool:
    """Workers on nodes that are gone, unclassified, of another class now or NotReady."""
    if view.lost_nodes(status.allocation):
        return True
    allocation = status.allocation
    return allocation is not None and any(w.node not in view.node_class for w in allocation.workers)


def live_snapshot(view: ClusterView, now: float) -> Snapshot:
    """The scheduler's snapshot of the live cluster."""
    return build_snapshot(view, job_requests(view), now)
