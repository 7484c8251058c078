"""The kopf handlers: thin. They validate, keep the indexes, and wake the scheduling loop.

Everything after validation (placement, pods, restarts, suspension, preemption) happens in the
scheduling loop, the one writer of job status, so handlers never race each other over a job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import kopf

from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, PodFacts
from hetero_operator.controller.inventory import pod_index_key
from hetero_operator.controller.k8s import KubeClient
from hetero_operator.controller.lifecycle import invalid
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.scheduling_loop import INDEX_NAMES, SchedulingLoop
from hetero_operator.controller.validation import parse_job
from hetero_operator.resources import (
    GROUP,
    VERSION,
    GPUClass,
    HeteroTrainJobStatus,
    InvalidResourceError,
)

JOBS = (GROUP, VERSION, "heterotrainjobs")
CLASSES = (GROUP, VERSION, "gpuclasses")


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


@kopf.index(*CLASSES)
async def htj_classes(
    body: kopf.Body, name: str, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> dict[str, ClassFacts] | None:
    _wake(memo)
    try:
        model = GPUClass.from_k8s(dict(body))
    except InvalidResourceError as error:
        logger.warning("GPUClass %s ignored: %s", name, error)
        return None
    return {name: ClassFacts.from_model(model)}


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


# --- job validation ------------------------------------------------------------------------------


def _validate(body: kopf.Body, patch: kopf.Patch, now: float, memo: kopf.Memo) -> None:
    """Invalid specs get Valid=False at once, naming the field; valid ones are queued by the
    scheduling loop (the one writer of a valid job's phase), which this wakes."""
    _, problems = parse_job(dict(body))
    if problems:
        message = "; ".join(problems)
        try:
            status = HeteroTrainJobStatus.model_validate(body.get("status") or {})
        except ValueError:
            status = HeteroTrainJobStatus()
        patch.status.update(_invalid(status, message, now))
        kopf.warn(body, reason="InvalidSpec", message=message)
    _wake(memo)


def _invalid(status: HeteroTrainJobStatus, message: str, now: float) -> dict[str, Any]:
    return invalid(status, [message], now).to_wire()


@kopf.on.create(*JOBS)
async def job_created(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _validate(body, patch, time.time(), memo)


@kopf.on.resume(*JOBS)
async def job_resumed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    if not (body.get("status") or {}).get("phase"):
        _validate(body, patch, time.time(), memo)


@kopf.on.update(*JOBS, field="spec")
async def job_spec_changed(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    _validate(body, patch, time.time(), memo)


@kopf.on.field(*JOBS, field="spec.suspend")
async def suspend_changed(body: kopf.Body, new: Any, memo: kopf.Memo, **_: Any) -> None:
    kopf.info(body, reason="SuspendChanged", message=f"spec.suspend is now {bool(new)}")
    _wake(memo)


@kopf.on.delete(*JOBS)
async def job_deleted(name: str, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    """Remove the workers and everything else the job owns (the garbage collector would too, later)."""
    assert namespace is not None
    loop: SchedulingLoop = memo.loop
    await loop.delete_job_objects(namespace, name)


# --- operator start and stop ---------------------------------------------------------------------


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    connection: kopf.ConnectionInfo = memo.connection
    return connection


@kopf.on.startup()
async def start_loop(memo: kopf.Memo, **kwargs: Any) -> None:
    """Start the scheduling loop over kopf's live indexes (they fill as the watches begin)."""
    client = KubeClient(memo.connection)
    metrics = OperatorMetrics()
    if memo.metrics_port:
        metrics.serve(memo.metrics_port)
    indexes = {name: kwargs[name] for name in INDEX_NAMES}
    loop = SchedulingLoop(client, indexes, memo.loop_config, metrics)
    memo.client, memo.metrics, memo.loop = client, metrics, loop
    memo.loop_task = asyncio.create_task(loop.run(), name="heterotrain scheduling loop")
    if getattr(memo, "api_port", 0):
        # The HTTP API runs in the operator's own event loop and serves the operator's metrics too.
        from hetero_operator.api import create_app
        from hetero_operator.api.server import serve
        from hetero_operator.api.settings import ApiSettings

        kubeconfig = os.environ.get("KUBECONFIG")  # set by `run` from --kubeconfig; else in-cluster
        settings = ApiSettings(
            kubeconfig=Path(kubeconfig) if kubeconfig else None,
            registry=metrics.registry,
            scheduler=memo.loop_config.scheduler,
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
