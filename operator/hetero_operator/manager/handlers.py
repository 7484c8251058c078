"""The kopf handlers: thin. They validate, keep the indexes, and wake the scheduling loop.

Everything after validation (placement, pods, restarts, suspension, preemption) happens in the
scheduling loop, the one writer of job status, so handlers never race each other over a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any, TypeVar

import kopf

from hetero_operator.controller import names
from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, PodFacts, QueueFacts
from hetero_operator.controller.inventory import KUEUE_INDEX_NAMES, pod_index_key
from hetero_operator.controller.k8s import KubeClient
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.peering import Leadership, PeeringConfig
from hetero_operator.controller.scheduling_loop import INDEX_NAMES, SchedulingLoop
from hetero_operator.kueue import constants as kueue
from hetero_operator.kueue.facts import ClusterQueueFacts, FlavorFacts, LocalQueueFacts, WorkloadFacts
from hetero_operator.manager.job_tasks import PrometheusTasks
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.resources import (
    GROUP,
    VERSION,
    GPUClass,
    HeteroQueue,
    InvalidResourceError,
    MeasuredProfile,
    WorkloadProfile,
)

JOBS = (GROUP, VERSION, "heterotrainjobs")
CLASSES = (GROUP, VERSION, "gpuclasses")
QUEUES = (GROUP, VERSION, "heteroqueues")
PROFILES = (GROUP, VERSION, "workloadprofiles")
WORKLOADS = (kueue.GROUP, kueue.VERSION, "workloads")


def _wake(memo: kopf.Memo) -> None:
    loop = getattr(memo, "loop", None)
    if loop is not None:
        loop.trigger()


# --- indexes: what the scheduling loop reads ------------------------------------------------------
# kopf calls an index function on every change of its objects, so each also wakes the loop: no
# separate event handlers (at thousands of pods, a second handler per event costs real CPU).


@kopf.index("", "v1", "nodes")
async def htj_nodes(body: kopf.Body, name: str, memo: kopf.Memo, **_: Any) -> dict[str, NodeFacts]:
    _wake(memo)
    return {name: NodeFacts.from_body(body)}


Parsed = TypeVar("Parsed", GPUClass, HeteroQueue, WorkloadProfile)


def _parsed(kind: type[Parsed], body: kopf.Body, name: str, logger: kopf.Logger) -> Parsed | None:
    """The cluster-scoped object as its model; an invalid one is left out of the index, with a warning."""
    try:
        return kind.from_k8s(dict(body))
    except InvalidResourceError as error:
        logger.warning("%s %s ignored: %s", kind.__name__, name, error)
        return None


@kopf.index(*CLASSES)
async def htj_classes(
    body: kopf.Body, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> dict[str, ClassFacts] | None:
    _wake(memo)
    model = _parsed(GPUClass, body, name, logger)
    return None if model is None else {name: ClassFacts.from_model(model)}


@kopf.index(*QUEUES)
async def htj_queues(
    body: kopf.Body, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> dict[str, QueueFacts] | None:
    _wake(memo)
    model = _parsed(HeteroQueue, body, name, logger)
    return None if model is None else {name: QueueFacts.from_model(model)}


@kopf.index(*PROFILES)
async def htj_profiles(
    body: kopf.Body, name: str, logger: kopf.Logger, **_: Any
) -> dict[str, MeasuredProfile] | None:
    """The throughput catalog: each workload key's estimate. It changes as jobs measure themselves and
    matters at the next placement, so it wakes no cycle."""
    model = _parsed(WorkloadProfile, body, name, logger)
    if model is None or model.status is None or model.status.estimate is None:
        return None
    return {model.spec.workload: model.status.estimate}


@kopf.index("", "v1", "pods")
async def htj_pods(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, PodFacts] | None:
    """Our workers, and any other bound pod that holds extended resources (GPUs)."""
    pod = PodFacts.from_body(body)
    if pod.job is None and not (pod.resources and pod.node):
        return None
    _wake(memo)
    return {pod_index_key(pod): pod}


@kopf.index(*JOBS)
async def htj_jobs(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, JobFacts]:
    _wake(memo)
    facts = JobFacts.from_body(body)
    return {facts.key: facts}


def _deleted(type: str | None, **_: Any) -> bool:
    return type == "DELETED"


@kopf.on.event("", "v1", "pods", when=_deleted)
async def pod_deleted(memo: kopf.Memo, **_: Any) -> None:
    """Index functions do not see deletions; a pod that is gone frees its GPUs."""
    _wake(memo)


@kopf.on.event("", "v1", "nodes", when=_deleted)
async def node_deleted(memo: kopf.Memo, **_: Any) -> None:
    _wake(memo)


# --- Kueue: registered by `register_kueue_indexes` when the integration is on ---------------------


async def htj_workloads(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, WorkloadFacts] | None:
    """The Workloads of HeteroTrainJobs, by job."""
    facts = WorkloadFacts.from_body(body)
    if facts is None:
        return None
    _wake(memo)
    return {facts.job_key: facts}


async def htj_local_queues(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, LocalQueueFacts]:
    _wake(memo)
    facts = LocalQueueFacts.from_body(body)
    return {f"{facts.namespace}/{facts.name}": facts}


async def htj_cluster_queues(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, ClusterQueueFacts]:
    """Quotas and their usage: a change may let a waiting job's mix in, or call for another."""
    _wake(memo)
    facts = ClusterQueueFacts.from_body(body)
    return {facts.name: facts}


async def htj_flavors(body: kopf.Body, memo: kopf.Memo, **_: Any) -> dict[str, FlavorFacts]:
    _wake(memo)
    facts = FlavorFacts.from_body(body)
    return {facts.name: facts}


async def workload_deleted(memo: kopf.Memo, **_: Any) -> None:
    _wake(memo)


def register_kueue_indexes() -> None:
    """Watch Kueue's objects (their CRDs must exist: Kueue is installed)."""
    managed = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
    kopf.index(*WORKLOADS, labels=managed)(htj_workloads)
    kopf.on.event(*WORKLOADS, labels=managed, when=_deleted)(workload_deleted)
    kopf.index(kueue.GROUP, kueue.VERSION, "localqueues")(htj_local_queues)
    kopf.index(kueue.GROUP, kueue.VERSION, "clusterqueues")(htj_cluster_queues)
    kopf.index(kueue.GROUP, kueue.VERSION, "resourceflavors")(htj_flavors)


# --- jobs ---------------------------------------------------------------------------------------
# No change handlers on jobs: the scheduling loop validates every job it sees (Valid=False naming the
# field, and an InvalidSpec event), owns the cleanup finalizer and removes a deleted job's objects.
# kopf change handlers would cost a diff of every job event and several patches per job.


# --- operator start and stop ---------------------------------------------------------------------


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    connection: kopf.ConnectionInfo = memo.connection
    return connection


@kopf.on.startup()
async def start_loop(memo: kopf.Memo, **kwargs: Any) -> None:
    """Start the scheduling loop over kopf's live indexes (they fill as the watches begin)."""
    metrics = OperatorMetrics()
    client = KubeClient(memo.connection, on_request=metrics.count_request)
    if memo.metrics_port:
        metrics.serve(memo.metrics_port)
    indexes = {name: kwargs[name] for name in (*INDEX_NAMES, *KUEUE_INDEX_NAMES) if name in kwargs}
    loop = SchedulingLoop(client, indexes, memo.loop_config, metrics)
    rebalancer: RebalancerSettings | None = getattr(memo, "rebalancer", None)
    if rebalancer is not None:
        loop.tasks = (PrometheusTasks(client, rebalancer, metrics, loop.freshest, loop.clock),)
    memo.client, memo.metrics, memo.loop = client, metrics, loop
    peering: PeeringConfig | None = getattr(memo, "peering", None)
    # With peering, the loop runs only on the active replica: kopf pauses its own handlers on a
    # standby, but not tasks the operator starts itself.
    leadership = Leadership(client, peering) if peering is not None else None
    work = loop.run() if leadership is None else leadership.run_while_active(loop.run, loop.trigger)
    memo.loop_task = asyncio.create_task(work, name="heterotrain scheduling loop")
    if getattr(memo, "api_port", 0):
        # The HTTP API runs in the operator's own event loop and serves the operator's metrics too.
        from hetero_operator.api import create_app
        from hetero_operator.api.health import OperatorChecks
        from hetero_operator.api.server import serve
        from hetero_operator.api.settings import ApiSettings

        kubeconfig = os.environ.get("KUBECONFIG")  # set by `run` from --kubeconfig; else in-cluster
        settings = ApiSettings(
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            registry=metrics.registry,
            scheduler=memo.loop_config.scheduler,
            host=OperatorChecks(
                cycles=lambda: loop.cycles,
                tasks=lambda: {"schedulingLoop": getattr(memo, "loop_task", None)},
                standby=lambda: leadership is not None and not leadership.active,
            ),
        )
        memo.api_task = asyncio.create_task(
            serve(create_app(settings), "0.0.0.0", memo.api_port), name="heterotrain HTTP API"
        )


@kopf.on.cleanup()
async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
    for task in (getattr(memo, "loop_task", None), getattr(memo, "api_task", None)):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    client = getattr(memo, "client", None)
    if client is not None:
        await client.close()
