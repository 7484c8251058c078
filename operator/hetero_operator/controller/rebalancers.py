"""The rebalancers of running jobs: one task per job, asking the rebalancer for the next plan every
few seconds. The scheduling loop starts and stops them at the end of each cycle, so they run only on
the active replica and need no finalizer of their own (a deleted or stopped job's task is cancelled
by the next cycle)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

import httpx

from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.rebalance.runner import JobMemory, KubeWriter, Rebalancer, RebalancerSettings

log = logging.getLogger("heterotrain.rebalancer")

TICK_SECONDS = 2.0
RETRY_SECONDS = 0.5


def wants_rebalancer(facts: JobFacts) -> bool:
    """A running job whose spec leaves rebalancing on."""
    job = facts.model
    if job is None or facts.deleting or facts.phase != "Running":
        return False
    return job.spec.rebalance.enabled


class Rebalancers:
    def __init__(
        self,
        client: KubeWriter,
        settings: RebalancerSettings,
        metrics: OperatorMetrics,
        newest: Callable[[str], JobFacts | None],
        tick_seconds: float = TICK_SECONDS,
    ) -> None:
        """`newest(key)`: the freshest facts of a job (the index), read before every pass."""
        self.client = client
        self.settings = settings
        self.metrics = metrics
        self.newest = newest
        self.tick_seconds = tick_seconds
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def running(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def sync(self, jobs: Mapping[str, JobFacts]) -> None:
        """One task for every job that wants one, none for the others."""
        wanted = {key for key, facts in jobs.items() if wants_rebalancer(facts)}
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
        for key in sorted(wanted):
            task = self._tasks.get(key)
            if task is None or task.done():  # a task that ended on an error starts again
                self._tasks[key] = asyncio.create_task(self._run(key), name=f"rebalancer {key}")

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        memory = JobMemory()
        try:
            async with httpx.AsyncClient() as http:
                rebalancer = Rebalancer(self.client, http, self.settings)
                log.info("%s: rebalancing every %.0f s", key, self.tick_seconds)
                pause = self.tick_seconds
                while True:
                    await asyncio.sleep(pause)
                    facts = self.newest(key)
                    if facts is None or facts.model is None:
                        continue  # the next cycle stops this task if the job is gone
                    try:
                        await rebalancer.tick(facts.model.to_k8s(), memory)
                    except Exception as err:  # a failed pass must never end the job's rebalancing
                        log.warning("%s: rebalancing pass failed: %s", key, err)
                    self._export_prediction(namespace, name, memory)
                    # While Prometheus is away, look again sooner: the job should not finish an
                    # epoch still saying so after it is back.
                    pause = RETRY_SECONDS if memory.prometheus_unreachable else self.tick_seconds
        finally:
            log.info("%s: rebalancing stopped", key)
            self.metrics.forget_job(namespace, name)

    def _export_prediction(self, namespace: str, name: str, memory: JobMemory) -> None:
        """The predicted step time of the newest plan read, the one in effect (a plan published in
        this pass is read on the next one, when the workers pick it up too)."""
        if memory.plans:
            plan = memory.plans[max(memory.plans)]
            self.metrics.set_predicted_step(namespace, name, plan.version, plan.predicted_iteration_seconds)
