"""One rebalancing pass for one running job: measure, decide, publish. Called once per tick by the
job's rebalancer task (`controller.rebalancers`); every decision is delegated to the pure `decide`."""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import httpx

from hetero_operator.controller import names
from hetero_operator.controller.conditions import owned_by_rebalancer, patch_status
from hetero_operator.controller.k8s import path_of
from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan
from hetero_operator.planner import LrScaling, PerfSample
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.decide import BatchPolicy, RebalanceDecision, confirm, decide, record
from hetero_operator.rebalance.measurements import (
    JobMeasurements,
    MetricsUnavailable,
    MissingRanks,
    NotEnoughSamples,
    check,
)

log = logging.getLogger("heterotrain.rebalancer")

CONDITION = "MetricsAvailable"
PROMETHEUS_UNAVAILABLE = "PrometheusUnavailable"
MAX_REBALANCE_RECORDS = 20


class KubeWriter(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...

    async def create_or_replace_data(self, manifest: Mapping[str, Any]) -> None: ...

    async def post_event(
        self, involved: Mapping[str, str], event_type: str, reason: str, message: str
    ) -> None: ...


@dataclass(frozen=True)
class RebalancerSettings:
    prometheus_url: str
    min_steps: int = 3
    max_staleness_seconds: float = 60.0
    # A Prometheus that comes back finds the worker pods again and scrapes each within a few
    # intervals; a rank it has not scraped by then is missing in earnest.
    rediscovery_grace_seconds: float = 30.0


@dataclass
class JobMemory:
    """What the job's rebalancer remembers between ticks; everything else is re-read (restart-safe)."""

    measured: dict[int, JobMeasurements] = field(default_factory=dict)  # by plan version
    plans: dict[int, Plan] = field(default_factory=dict)
    epoch_started: dict[int, float] = field(default_factory=dict)  # epoch -> monotonic time first seen
    last_decided_version: int = 0
    converged: bool = False  # the last rebalance did not pay off as measured: keep the split
    prometheus_unreachable: bool = False  # the last pass could not reach Prometheus
    prometheus_back_at: float | None = None  # monotonic time Prometheus answered after an outage


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_of(spec: Mapping[str, Any], world_size: int, classes: list[str]) -> BatchPolicy:
    batch = spec.get("batch") or {}
    base = int(batch.get("global", 1))
    per_class = batch.get("perGpuClassMax") or {}
    rebalance = spec.get("rebalance") or {}
    return BatchPolicy(
        base_global_batch=base,
        minimum=int(batch.get("min") or base),
        maximum=int(batch.get("max") or base),
        adaptive=bool(batch.get("adaptive", False)),
        min_improvement=float(rebalance.get("minImprovement", 0.05)),
        per_worker_max=tuple(per_class.get(c) for c in classes) if classes else (None,) * world_size,
        lr_scaling=LrScaling.SQRT,
    )


def _conditions_with(
    status: Mapping[str, Any], ok: bool, reason: str, message: str
) -> list[dict[str, Any]] | None:
    """The conditions list with MetricsAvailable set; None when nothing changes."""
    conditions = [dict(c) for c in status.get("conditions") or []]
    wanted = "True" if ok else "False"
    for condition in conditions:
        if condition.get("type") == CONDITION:
            if condition.get("status") == wanted and condition.get("message") == message:
                return None
            if condition.get("status") != wanted:
                condition["lastTransitionTime"] = _now()
            condition.update(status=wanted, reason=reason, message=message[:1000])
            return conditions
    conditions.append(
        {
            "type": CONDITION,
            "status": wanted,
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": _now(),
        }
    )
    return conditions


def _condition_reason(status: Mapping[str, Any]) -> str | None:
    found = next((c for c in status.get("conditions") or [] if c.get("type") == CONDITION), None)
    return None if found is None else found.get("reason")


def eta_seconds(memory: JobMemory, epoch: int, epochs: int) -> float | None:
    """Remaining epochs times the mean duration of the last three whole epochs seen."""
    seen = sorted(memory.epoch_started.items())
    durations = [b[1] - a[1] for a, b in itertools.pairwise(seen) if b[0] == a[0] + 1]
    if not durations:
        return None
    recent = durations[-3:]
    return max(0.0, (epochs - epoch) * sum(recent) / len(recent))


class Rebalancer:
    def __init__(self, client: KubeWriter, http: httpx.AsyncClient, settings: RebalancerSettings) -> None:
        self.client = client
        self.http = http
        self.settings = settings

    async def _current_plan(self, namespace: str, job: str) -> Plan | None:
        config_map = await self.client.get(path_of("ConfigMap", namespace, names.plan_config_map_name(job)))
        text = ((config_map or {}).get("data") or {}).get(PLAN_CONFIGMAP_KEY)
        return Plan.from_json(text) if text else None

    async def tick(self, body: Mapping[str, Any], memory: JobMemory) -> RebalanceDecision | None:
        """Update progress and, once the job has run `everyEpochs` under its newest plan, rebalance."""
        meta, spec = body["metadata"], body.get("spec") or {}
        status = body.get("status") or {}
        namespace, name = meta["namespace"], meta["name"]
        status_path = path_of("HeteroTrainJob", namespace, name, "status")
        plan = await self._current_plan(namespace, name)
        if plan is None:
            return None
        memory.plans[plan.version] = plan
        try:
            measured = await promql.fetch(
                self.http, self.settings.prometheus_url, namespace, name, plan.version
            )
        except MetricsUnavailable as why:
            memory.prometheus_unreachable = True
            await self._set_condition(status_path, status, False, PROMETHEUS_UNAVAILABLE, str(why))
            return None
        said_unavailable = _condition_reason(status) == PROMETHEUS_UNAVAILABLE
        if memory.prometheus_unreachable or said_unavailable:
            memory.prometheus_back_at = time.monotonic()
        memory.prometheus_unreachable = False
        if said_unavailable:
            # Say the outage is over now: the next decision, which would say so too, may never come
            # once the split has settled.
            log.info("%s: Prometheus answers again", status_path)
            status = await self._set_condition(
                status_path, status, True, "PrometheusReachable", "Prometheus answers again"
            )
        await self._progress(status_path, spec, measured, memory)
        every = int((spec.get("rebalance") or {}).get("everyEpochs", 1))
        if measured.epoch is None or measured.epoch < plan.apply_at_epoch + every:
            return None
        epochs = int(spec.get("epochs") or 0)
        if epochs and measured.epoch + 1 >= epochs:
            # The last epoch: no boundary is left for a new plan to start at, and workers that
            # finish drop out of the metrics (which is no fault of theirs).
            return None
        if plan.version <= memory.last_decided_version:
            return None
        try:
            check(measured, plan.world_size, self.settings.min_steps, self.settings.max_staleness_seconds)
        except NotEnoughSamples:
            return None
        except MetricsUnavailable as why:
            if isinstance(why, MissingRanks) and self._rediscovering(memory):
                log.info(
                    "%s: %s; Prometheus is back since moments ago: waiting for its scrapes", status_path, why
                )
                return None
            await self._set_condition(status_path, status, False, "InvalidMetrics", str(why))
            return None
        status = await self._set_condition(
            status_path, status, True, "WorkersReporting", "every worker reports metrics"
        )
        memory.measured[plan.version] = measured
        history = await self._history(namespace, name, memory)
        classes = [
            w["gpuClass"]
            for w in sorted((status.get("allocation") or {}).get("workers") or [], key=lambda w: w["rank"])
        ]
        if memory.converged:
            return None
        policy = policy_of(spec, plan.world_size, classes)
        decision = None
        previous = memory.plans.get(plan.version - 1)
        previous_measured = memory.measured.get(plan.version - 1)
        if previous is not None and previous_measured is not None and not policy.adaptive:
            decision = confirm(
                plan, measured, previous, previous_measured, policy.min_improvement, measured.epoch + 1
            )
            memory.converged = decision is not None
        if decision is None:
            decision = decide(plan, history, policy, measured, measured.epoch + 1)
        memory.last_decided_version = plan.version
        await self._publish(namespace, name, status_path, status, plan, decision)
        return decision

    def _rediscovering(self, memory: JobMemory) -> bool:
        back = memory.prometheus_back_at
        return back is not None and time.monotonic() - back < self.settings.rediscovery_grace_seconds

    async def _history(self, namespace: str, job: str, memory: JobMemory) -> dict[int, list[PerfSample]]:
        """Samples of every plan version measured so far, oldest first (refetched after a restart)."""
        history: dict[int, list[PerfSample]] = {}
        for version in sorted(memory.plans):
            measured = memory.measured.get(version)
            if measured is None:
                try:
                    measured = await promql.fetch(
                        self.http, self.settings.prometheus_url, namespace, job, version
                    )
                except MetricsUnavailable:
                    continue
                if not measured.workers or any(
                    not math.isfinite(w.compute_seconds) for w in measured.workers
                ):
                    continue
                memory.measured[version] = measured
            history = record(history, measured, memory.plans[version])
        return history

    async def _progress(
        self, path: str, spec: Mapping[str, Any], measured: JobMeasurements, memory: JobMemory
    ) -> None:
        if measured.epoch is None:
            return
        memory.epoch_started.setdefault(measured.epoch, time.monotonic())
        epochs = int(spec.get("epochs") or 0)
        rate = measured.samples_per_second
        progress: dict[str, Any] = {
            "epoch": measured.epoch,
            "samplesPerSecond": round(rate, 2)
            if rate is not None and math.isfinite(rate) and rate >= 0
            else 0.0,
        }
        eta = eta_seconds(memory, measured.epoch, epochs)
        if eta is not None:
            progress["etaSeconds"] = round(eta, 1)
        await self.client.merge_patch(path, {"status": {"progress": progress}})

    async def _set_condition(
        self, path: str, status: Mapping[str, Any], ok: bool, reason: str, message: str
    ) -> Mapping[str, Any]:
        """Write the condition; the status as it now stands, for a later write in the same pass
        (which must not judge a transition against the condition as it was before this one)."""
        conditions = _conditions_with(status, ok, reason, message)
        if conditions is None:
            return status
        if not ok:
            log.warning("%s: %s", path, message)
        await patch_status(self.client, path, {"conditions": conditions}, owned_by_rebalancer)
        return {**status, "conditions": conditions}

    async def _publish(
        self,
        namespace: str,
        name: str,
        status_path: str,
        status: Mapping[str, Any],
        current: Plan,
        decision: RebalanceDecision,
    ) -> None:
        plan_status = dict(status.get("plan") or {})
        plan_status["measuredIterationSeconds"] = round(decision.measured_seconds, 6)
        records = [dict(r) for r in status.get("rebalances") or []]
        if records and records[-1].get("toVersion") == current.version:
            records[-1]["measuredIterationSeconds"] = round(decision.measured_seconds, 6)
        patch: dict[str, Any] = {"plan": plan_status, "rebalances": records}
        new = decision.plan
        if new is not None:
            config_map = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": names.plan_config_map_name(name),
                    "namespace": namespace,
                    "labels": {names.LABEL_JOB: name, names.LABEL_MANAGED_BY: names.MANAGED_BY},
                },
                "data": {PLAN_CONFIGMAP_KEY: new.to_json()},
            }
            await self.client.create_or_replace_data(config_map)
            predicted_current = decision.predicted_current_seconds or 0.0
            predicted_new = new.predicted_iteration_seconds or 0.0
            gain = 1 - predicted_new / predicted_current if predicted_current > 0 else 0.0
            patch["plan"] = {
                "version": new.version,
                "epoch": new.apply_at_epoch,
                "globalBatch": new.global_batch,
                "localBatches": list(new.local_batches),
                "predictedIterationSeconds": round(predicted_new, 6),
                "measuredIterationSeconds": None,
            }
            records.append(
                {
                    "time": _now(),
                    "epoch": new.apply_at_epoch,
                    "fromVersion": current.version,
                    "toVersion": new.version,
                    "predictedGain": round(gain, 4),
                    "predictedIterationSeconds": round(predicted_new, 6),
                    "reason": decision.reason[:500],
                }
            )
            patch["rebalances"] = records[-MAX_REBALANCE_RECORDS:]
            involved = {
                "apiVersion": "heterotrain.io/v1alpha1",
                "kind": "HeteroTrainJob",
                "name": name,
                "namespace": namespace,
            }
            await self.client.post_event(
                involved, "Normal", "Rebalanced", f"plan v{new.version}: {decision.reason}"
            )
            log.info("%s/%s: plan v%d %s", namespace, name, new.version, new.local_batches)
        await self.client.merge_patch(status_path, {"status": patch})
