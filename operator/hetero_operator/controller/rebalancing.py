"""One daemon per running job that asks the rebalancer for the next plan every few seconds."""

from __future__ import annotations

from typing import Any

import httpx
import kopf

from hetero_operator.controller.handlers import JOBS
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
    async with httpx.AsyncClient() as http:
        rebalancer = Rebalancer(client, http, settings)
        while not stopped:
            try:
                await rebalancer.tick(body, memory)
            except Exception as err:  # a failed pass must never stop the job's rebalancing for good
                logger.warning("rebalancing pass failed: %s", err)
            await stopped.wait(TICK_SECONDS)
