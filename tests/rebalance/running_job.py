"""A running job as the rebalancer finds it, in the in-process Kubernetes: its body with an
allocation, and its plan ConfigMap."""

from __future__ import annotations

from typing import Any

import httpx
from tests.fakekube import FakeKube
from tests.operator.builders import job_body

from hetero_operator.controller import launcher
from hetero_operator.controller.plans import plan_status
from hetero_operator.plan import Plan
from hetero_operator.rebalance.decide import RebalanceDecision
from hetero_operator.rebalance.job_metrics import fetch_snapshot
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.resources import HeteroTrainJob


def running_job(
    kube: FakeKube,
    plan: Plan,
    conditions: list[dict[str, Any]] | None = None,
    name: str = "job",
    namespace: str = "ns",
    **spec: Any,
) -> HeteroTrainJob:
    world = plan.world_size
    spec.setdefault("epochs", 10)
    spec.setdefault("rebalance", {"everyEpochs": 1})
    body = job_body(
        name, namespace, gpus={"min": world, "max": world}, batch={"global": plan.global_batch}, **spec
    )
    workers = [{"rank": r, "node": f"node-{r}", "gpuClass": "fast", "gpus": 1} for r in range(world)]
    body["status"] = {
        "phase": "Running",
        "allocation": {"workers": workers, "generation": 0, "totalGpus": world, "classes": f"fast:{world}"},
        "conditions": conditions or [],
        "plan": plan_status(plan).to_wire(),
    }
    kube.put(body)
    job = current(kube, namespace, name)
    kube.put(launcher.plan_config_map(job, plan))
    return job


def current(kube: FakeKube, namespace: str = "ns", name: str = "job") -> HeteroTrainJob:
    """The job as the rebalancer's task reads it before a pass (its newest stored state)."""
    body = kube.obj("HeteroTrainJob", namespace, name)
    assert body is not None
    return HeteroTrainJob.from_k8s(body)


def metrics_available(kube: FakeKube, namespace: str = "ns", name: str = "job") -> dict[str, Any] | None:
    body = kube.obj("HeteroTrainJob", namespace, name) or {}
    return next(
        (c for c in (body.get("status") or {}).get("conditions") or [] if c["type"] == "MetricsAvailable"),
        None,
    )


async def tick(
    rebalancer: Rebalancer, http: httpx.AsyncClient, kube: FakeKube, memory: JobMemory
) -> RebalanceDecision | None:
    """One pass as the operator runs it: poll every job's epoch, then the job's rebalancer."""
    snapshot = await fetch_snapshot(http, rebalancer.settings.prometheus_url)
    return await rebalancer.tick(current(kube), memory, snapshot)
