"""One rebalancing pass for one running job: measure, decide, publish. Called every tick by the job's
task (`rebalance.tasks`); every decision is delegated to the pure `decide`, and every object it
writes (conditions, the plan ConfigMap, Events, rebalance records) is built by the same builders the
scheduling loop uses."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Protocol

import httpx

from hetero_operator.controller import launcher, names
from hetero_operator.controller.clock import Clock
from hetero_operator.controller.events import job_event
from hetero_operator.controller.k8s import path_of
from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan
from hetero_operator.planner import PerfSample
from hetero_operator.rebalance import promql, watch_step
from hetero_operator.rebalance.catalog_writes import record_published
from hetero_operator.rebalance.decide import RebalanceDecision, batch_policy, measured_iteration_seconds
from hetero_operator.rebalance.history import record
from hetero_operator.rebalance.job_metrics import MetricsSnapshot
from hetero_operator.rebalance.job_status import MetricsState, published_status, said_unavailable
from hetero_operator.rebalance.measurements import (
    JobMeasurements,
    MetricsUnavailable,
    MissingRanks,
    NotEnoughSamples,
    check,
)
from hetero_operator.rebalance.memory import JobMemory, due, watch_due
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.rebalance.stage_cuts import LayerCostsMissing, recut
from hetero_operator.rebalance.step import Look, Origin, Round, Watched, step
from hetero_operator.rebalance.watch import Totals
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus

log = logging.getLogger("heterotrain.rebalancer")
KIND = "HeteroTrainJob"


class KubeWriter(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def create(self, manifest: Mapping[str, Any]) -> bool: ...

    async def create_or_replace_data(self, manifest: Mapping[str, Any]) -> None: ...


class Rebalancer:
    def __init__(
        self, client: KubeWriter, http: httpx.AsyncClient, settings: RebalancerSettings, clock: Clock
    ) -> None:
        self.client = client
        self.http = http
        self.settings = settings
        self.clock = clock

    async def _current_plan(self, job: HeteroTrainJob, memory: JobMemory) -> Plan | None:
        """The plan the workers run, read from its ConfigMap once per version (the status names it)."""
        wanted = job.status.plan.version if job.status is not None and job.status.plan is not None else None
        if wanted in memory.plans:
            return memory.plans[wanted]
        path = path_of("ConfigMap", job.namespace, names.plan_config_map_name(job.name))
        text = ((await self.client.get(path) or {}).get("data") or {}).get(PLAN_CONFIGMAP_KEY)
        plan = Plan.from_json(text) if text else None
        if plan is None or plan.version != wanted:
            return None  # the ConfigMap has not caught up with the status yet
        memory.plans[plan.version] = plan
        return plan

    async def _fetch(self, job: HeteroTrainJob, version: int) -> JobMeasurements:
        return await promql.fetch(self.http, self.settings.prometheus_url, job.namespace, job.name, version)

    async def tick(
        self, job: HeteroTrainJob, memory: JobMemory, snapshot: MetricsSnapshot | None
    ) -> RebalanceDecision | None:
        """Once the job has run `everyEpochs` under its newest plan, rebalance (`snapshot`: epochs)."""
        if snapshot is None:
            return None
        state = MetricsState(self.client, job, self.clock)
        if not snapshot.reachable:
            memory.prometheus_unreachable = True
            await state.say(False, promql.PROMETHEUS_UNAVAILABLE, snapshot.error)
            return None
        await self._back(state, memory)
        epoch = snapshot.of(f"{job.namespace}/{job.name}").epoch
        if watch_due(job, epoch, memory):
            return await self._watch(job, state, memory, epoch)
        if not due(job, epoch, memory):
            return None
        plan = await self._current_plan(job, memory)
        if plan is None:
            return None
        try:
            measured = await self._fetch(job, plan.version)
        except MetricsUnavailable as why:
            memory.prometheus_unreachable = True
            await state.say(False, promql.PROMETHEUS_UNAVAILABLE, str(why))
            return None
        if not await self._usable(state, measured, plan, memory):
            return None
        await state.say(True, "WorkersReporting", "every worker reports metrics")
        memory.measured[plan.version] = measured
        history = await self._history(job, memory)
        policy = batch_policy(job.spec, self._classes(job))
        seen = Round(Origin.FIRST, plan, measured, epoch, policy, dict(memory.plans), dict(memory.measured))
        return await self._step(job, state, memory, replace(seen, history=history))

    async def _step(
        self, job: HeteroTrainJob, state: MetricsState, memory: JobMemory, seen: Round | Watched
    ) -> RebalanceDecision | None:
        """Step the job's rebalancing, fetching what each step asks for, then start the watch the
        last step asks for and publish its decision."""
        plan = seen.plan
        taken = step(memory.state, seen, self.settings)
        while True:
            memory.state = taken.state
            if taken.note is not None:
                log.info("%s/%s: %s", job.namespace, job.name, taken.note)
            if taken.look is Look.NOTHING:
                break
            if taken.look is Look.ROUND:
                assert taken.round is not None
                seen = taken.round  # a split decided on it is confirmed against it
                memory.measured[plan.version] = seen.measured
            elif taken.look is Look.HISTORY:
                assert isinstance(seen, Round)  # only a round asks for the history or the stage cuts
                history = await self._history(job, memory)  # may read measurements missing so far
                seen = replace(seen, history=history, measurements=dict(memory.measured))
            else:
                assert isinstance(seen, Round)
                stage_cuts = await self._recut(job, plan, seen.measured)
                if stage_cuts is None:
                    return None  # the layer costs are not all in yet: look again on the next pass
                seen = replace(seen, stage_cuts=stage_cuts)
            taken = step(memory.state, seen, self.settings)
        if taken.watch is not None:
            try:
                totals: Totals | None = await self._fetch_totals(job, plan.version)
            except MetricsUnavailable:
                totals = None  # the next look starts the window
            watch = watch_step.start(memory.state.watch, plan.version, taken.watch, seen.epoch, totals)
            memory.state = replace(memory.state, watch=watch)
        if taken.decision is not None:
            await self._publish(job, state.status, plan, taken.decision)
        return taken.decision

    async def _fetch_totals(self, job: HeteroTrainJob, version: int) -> Totals:
        url = self.settings.prometheus_url
        return await promql.fetch_totals(self.http, url, job.namespace, job.name, version)

    async def _watch(
        self, job: HeteroTrainJob, state: MetricsState, memory: JobMemory, epoch: int | None
    ) -> RebalanceDecision | None:
        """One look at a settled split over the epochs since the last (`step.Watched`)."""
        plan = await self._current_plan(job, memory)
        if plan is None:
            return None
        try:
            totals = await self._fetch_totals(job, plan.version)
        except MetricsUnavailable:
            return None  # the outage is reported by the snapshot's pass
        policy = batch_policy(job.spec, self._classes(job))
        seen = Watched(plan, epoch, totals, policy, dict(memory.plans), dict(memory.measured))
        return await self._step(job, state, memory, seen)

    @staticmethod
    def _classes(job: HeteroTrainJob) -> list[str]:
        status = job.status or HeteroTrainJobStatus()
        workers = sorted(status.allocation.workers, key=lambda w: w.rank) if status.allocation else []
        return [w.gpu_class for w in workers]

    async def _back(self, state: MetricsState, memory: JobMemory) -> None:
        """Prometheus answered: say so now (the next decision may never come once the split settled)."""
        said = said_unavailable(state.status)
        if memory.prometheus_unreachable or said:
            memory.prometheus_back_at = self.clock.monotonic()
        memory.prometheus_unreachable = False
        if said:
            log.info("%s/%s: Prometheus answers again", state.job.namespace, state.job.name)
            await state.say(True, "PrometheusReachable", "Prometheus answers again")

    async def _usable(
        self, state: MetricsState, measured: JobMeasurements, plan: Plan, memory: JobMemory
    ) -> bool:
        try:
            check(measured, plan.world_size, self.settings.min_steps, self.settings.max_staleness_seconds)
        except NotEnoughSamples:
            return False
        except MetricsUnavailable as why:
            if isinstance(why, MissingRanks) and self._rediscovering(memory):
                log.info("%s: Prometheus is back since moments ago: waiting for its scrapes", why)
                return False
            await state.say(False, "InvalidMetrics", str(why))
            return False
        return True

    async def _recut(
        self, job: HeteroTrainJob, plan: Plan, measured: JobMeasurements
    ) -> RebalanceDecision | None:
        """HetPipe keeps its batch split; its stage cuts follow the layer costs the workers measured."""
        try:
            costs = await promql.fetch_layer_costs(
                self.http, self.settings.prometheus_url, job.namespace, job.name
            )
            found = recut(plan, costs, job.spec.rebalance.min_improvement, (measured.epoch or 0) + 1)
        except (MetricsUnavailable, LayerCostsMissing) as why:
            log.info("%s/%s: no stage cuts yet: %s", job.namespace, job.name, why)
            return None
        return RebalanceDecision(found.plan, found.reason, "stage-cuts", measured_iteration_seconds(measured))

    def _rediscovering(self, memory: JobMemory) -> bool:
        back = memory.prometheus_back_at
        return back is not None and self.clock.monotonic() - back < self.settings.rediscovery_grace_seconds

    async def _history(self, job: HeteroTrainJob, memory: JobMemory) -> dict[int, list[PerfSample]]:
        """Samples of every plan version measured so far, oldest first (refetched after a restart)."""
        history: dict[int, list[PerfSample]] = {}
        for version in sorted(v for v in memory.plans if v >= memory.state.history_from):
            measured = memory.measured.get(version)
            if measured is None:
                try:
                    measured = await self._fetch(job, version)
                except MetricsUnavailable:
                    continue
                if not measured.workers or any(
                    not math.isfinite(w.compute_seconds) for w in measured.workers
                ):
                    continue
                memory.measured[version] = measured
            history = record(history, measured, memory.plans[version])
        return history

    async def _publish(
        self, job: HeteroTrainJob, status: HeteroTrainJobStatus, current: Plan, decision: RebalanceDecision
    ) -> None:
        """The measured step of the plan in effect, and the new plan (ConfigMap, status, Event)."""
        now = self.clock.time()
        new = decision.plan
        if new is not None:
            await self.client.create_or_replace_data(launcher.plan_config_map(job, new))
            message = f"plan v{new.version}: {decision.reason}"
            await self.client.create(job_event(job, "Normal", "Rebalanced", message, now))
            log.info("%s/%s: plan v%d %s", job.namespace, job.name, new.version, new.local_batches)
        patch = published_status(status, current, decision, now)
        await self.client.merge_patch(path_of(KIND, job.namespace, job.name, "status"), {"status": patch})
        await record_published(self.client, job, patch, now)
