"""One daemon per running job that asks the rebalancer for the next plan every few seconds."""

from __future__ import annotations

from typing import Any

import httpx
import kopf

from hetero_operator.controller.handlers import JOBS
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.rebalance.runner import JobMemory, Rebalancer, RebalancerSettings

TICK_SECONDS = 2.0


def _wanted(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    enabled = (spec.get("rebalance") or {}).get("enabled", True)
    return bool(enabled) and status.get("phase") == "Running"


@kopf.daemon(*JOBS, when=_wanted, cancellation_timeout=5.0, initial_delay=1.0)
async def rebalance_job(*, body: kopf.Body, memo: Any, stopped: Any, logger: Any, **_: Any) -> None:
    settings: RebalancerSettings | None = getattr(memo, "rebalancer", None)
    client = getattr(memo, "client", None)
    if settings is None or client is None:
        return  # no Prometheus configured: jobs keep the plan they started with
    memory = JobMemory()
    metrics: OperatorMetrics | None = getattr(memo, "metrics", None)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    try:
        async with httpx.AsyncClient() as http:
            rebalancer = Rebalancer(client, http, settings)
            while not stopped:
                try:
                    await rebalancer.tick(body, memory)
                except Exception as err:  # a failed pass must never stop the job's rebalancing for good
                    logger.warning("rebalancing pass failed: %s", err)
                if metrics is not None:
                    _export_prediction(metrics, namespace, name, memory)
                await stopped.wait(TICK_SECONDS)
    finally:
        if metrics is not None:
            metrics.forget_job(namespace, name)


def _export_prediction(metrics: OperatorMetrics, namespace: str, name: str, memory: JobMemory) -> None:
    """The predicted step time of the newest plan read, the one in effect (a plan published in this
    pass is read on the next one, when the workers pick it up too)."""
    if memory.plans:
        plan = memory.plans[max(memory.plans)]
        metrics.set_predicted_step(namespace, name, plan.version, plan.predicted_iteration_seconds)
