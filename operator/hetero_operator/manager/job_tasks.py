"""What running jobs get when Prometheus is configured: their progress (one poller for all jobs), and
unless the spec turns it off, a rebalancer each. One HTTP client serves them all."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import httpx

from hetero_operator.controller.clock import Clock
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.k8s import KubeClient
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.rebalance.job_metrics import JobMetricsPoller
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.rebalance.tasks import JobPass, JobTaskRunner, wants_rebalancer
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
        self.poller = JobMetricsPoller(
            client, self.http, settings.prometheus_url, clock, settings.tick_seconds
        )
        self.rebalancers = JobTaskRunner(
            "rebalancer",
            wants_rebalancer,
            self._rebalancing,
            newest,
            clock,
            settings.tick_seconds,
            on_stop=self._forget,
        )

    def sync(self, jobs: Mapping[str, JobFacts]) -> None:
        self.poller.sync(jobs)
        self.rebalancers.sync(jobs)

    async def stop(self) -> None:
        await self.rebalancers.stop()
        await self.poller.stop()
        await self.http.aclose()

    def _rebalancing(self, key: str) -> JobPass:
        memory = JobMemory()

        async def run(job: HeteroTrainJob) -> float:
            await self.rebalancer.tick(job, memory, self.poller.latest)
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

    def _forget(self, key: str) -> None:
        namespace, name = key.split("/", 1)
        self.metrics.forget_job(namespace, name)
