"""The per-job tasks a running job gets when Prometheus is configured: its progress, and (unless its
spec turns it off) its rebalancer. One HTTP client serves them all."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx

from hetero_operator.controller.clock import Clock
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.k8s import KubeClient
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.rebalance.progress import ProgressMemory, ProgressReporter
from hetero_operator.rebalance.runner import JobMemory, Rebalancer, RebalancerSettings
from hetero_operator.rebalance.tasks import JobPass, JobTaskRunner, running, wants_rebalancer
from hetero_operator.resources import HeteroTrainJob


class PrometheusTasks:
    """Rebalancers and progress reporters of running jobs (the loop's `JobTasks`)."""

    def __init__(
        self,
        client: KubeClient,
        settings: RebalancerSettings,
        metrics: OperatorMetrics,
        newest: Callable[[str], JobFacts | None],
        clock: Clock,
    ) -> None:
        self.http = httpx.AsyncClient()
        self.settings = settings
        self.metrics = metrics
        self.rebalancer = Rebalancer(client, self.http, settings, clock)
        self.progress = ProgressReporter(client, self.http, settings.prometheus_url, clock)
        self.runners = (
            JobTaskRunner(
                "rebalancer",
                wants_rebalancer,
                self._rebalancing,
                newest,
                clock,
                settings.tick_seconds,
                on_stop=self._forget,
            ),
            JobTaskRunner("progress", running, self._reporting, newest, clock, settings.tick_seconds),
        )

    def sync(self, jobs: Mapping[str, JobFacts]) -> None:
        for runner in self.runners:
            runner.sync(jobs)

    async def stop(self) -> None:
        for runner in self.runners:
            await runner.stop()
        await self.http.aclose()

    def _rebalancing(self, key: str) -> JobPass:
        memory = JobMemory()

        async def run(job: HeteroTrainJob) -> float:
            await self.rebalancer.tick(job, memory)
            if memory.plans:
                # The prediction of the newest plan read: the one in effect (a plan published in this
                # pass is read on the next one, when the workers pick it up too).
                plan = memory.plans[max(memory.plans)]
                self.metrics.set_predicted_step(
                    job.namespace, job.name, plan.version, plan.predicted_iteration_seconds
                )
            return (
                self.settings.retry_seconds if memory.prometheus_unreachable else self.settings.tick_seconds
            )

        return run

    def _reporting(self, key: str) -> JobPass:
        memory = ProgressMemory()

        async def run(job: HeteroTrainJob) -> float:
            await self.progress.tick(job, memory)
            return self.settings.tick_seconds

        return run

    def _forget(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        self.metrics.forget_job(namespace, name)
