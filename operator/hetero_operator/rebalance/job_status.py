"""What the rebalancer writes into a job's status: its MetricsAvailable condition, the measured step
of the plan in effect, and the new plan with a rebalance record. Built from the job's typed status
with the operator's own condition builders; only the writes themselves await."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from hetero_operator.controller.clock import Clock
from hetero_operator.controller.job_conditions import ConditionType, condition, set_condition
from hetero_operator.controller.k8s import path_of
from hetero_operator.controller.plans import plan_status
from hetero_operator.controller.status_writes import owned_by_rebalancer, patch_status
from hetero_operator.plan import Plan
from hetero_operator.planner import ClusterModel, WorkerModel
from hetero_operator.rebalance.decide import RebalanceDecision
from hetero_operator.rebalance.promql import PROMETHEUS_UNAVAILABLE
from hetero_operator.resources import (
    HeteroTrainJob,
    HeteroTrainJobStatus,
    MeasuredClass,
    MeasuredProfile,
    RebalanceRecord,
)
from hetero_operator.resources.job_status import MAX_REASON_LENGTH

log = logging.getLogger("heterotrain.rebalancer")


class StatusClient(Protocol):
    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None: ...

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None: ...


def said_unavailable(status: HeteroTrainJobStatus) -> bool:
    found = condition(status, ConditionType.METRICS_AVAILABLE)
    return found is not None and found.reason == PROMETHEUS_UNAVAILABLE


class MetricsState:
    """The job's MetricsAvailable condition through one pass: each write builds on the last, so a
    second write in the same pass never judges a transition against the condition as it was."""

    def __init__(self, client: StatusClient, job: HeteroTrainJob, clock: Clock) -> None:
        self.client = client
        self.job = job
        self.clock = clock
        self.status = job.status or HeteroTrainJobStatus()

    async def say(self, ok: bool, reason: str, message: str) -> None:
        kind = ConditionType.METRICS_AVAILABLE
        updated = set_condition(self.status, kind, ok, reason, message, self.clock.time())
        if updated is self.status:
            return
        if not ok:
            log.warning("%s/%s: %s", self.job.namespace, self.job.name, message)
        path = path_of("HeteroTrainJob", self.job.namespace, self.job.name, "status")
        conditions = [c.to_wire() for c in updated.conditions]
        await patch_status(self.client, path, {"conditions": conditions}, owned_by_rebalancer)
        self.status = updated


def measured_profile(model: ClusterModel, classes: Sequence[str], plan_version: int) -> MeasuredProfile:
    """The job's model per GPU class (`classes`: each rank's class): the mean of its workers' lines."""
    by_class: dict[str, list[WorkerModel]] = defaultdict(list)
    for worker, gpu_class in zip(model.workers, classes, strict=True):
        by_class[gpu_class].append(worker)

    def mean(values: Sequence[float]) -> float:
        return round(max(sum(values) / len(values), 0.0), 6)

    return MeasuredProfile(
        classes=[
            MeasuredClass(
                gpu_class=name,
                compute_ms_per_sample=mean([w.alpha for w in workers]),
                compute_fixed_ms=mean([w.beta for w in workers]),
                sync_ready_ms_per_sample=mean([w.alpha_sync for w in workers]),
                sync_ready_fixed_ms=mean([w.beta_sync for w in workers]),
                workers=len(workers),
            )
            for name, workers in sorted(by_class.items())
        ],
        overlapped_allreduce_ms=round(max(model.t_o, 0.0), 6),
        last_bucket_allreduce_ms=round(max(model.t_u, 0.0), 6),
        plan_version=plan_version,
    )


def published_status(
    status: HeteroTrainJobStatus, current: Plan, decision: RebalanceDecision, now: float
) -> dict[str, Any]:
    """The status patch of one decision: the measured step of the plan in effect (on `status.plan`
    and on the record that introduced it), the job's measured model per class (for its next
    placement) and, for a new plan, its summary and a new record."""
    measured = round(decision.measured_seconds, 6)
    records = list(status.rebalances)
    if records and records[-1].to_version == current.version:
        records[-1] = records[-1].model_copy(update={"measured_iteration_seconds": measured})
    plan: dict[str, Any] = {"measuredIterationSeconds": measured}
    new = decision.plan
    if new is not None:
        plan = {**plan_status(new).to_wire(), "measuredIterationSeconds": None}
        predicted_now = decision.predicted_current_seconds or 0.0
        predicted_new = new.predicted_iteration_seconds or 0.0
        record = RebalanceRecord(
            time=datetime.fromtimestamp(now, UTC).replace(microsecond=0),
            epoch=new.apply_at_epoch,
            from_version=current.version,
            to_version=new.version,
            predicted_gain=round(1 - predicted_new / predicted_now, 4) if predicted_now > 0 else 0.0,
            predicted_iteration_seconds=round(predicted_new, 6),
            reason=decision.reason[:MAX_REASON_LENGTH],
        )
        records = status.model_copy(update={"rebalances": records}).with_rebalance(record).rebalances
    patch: dict[str, Any] = {"plan": plan, "rebalances": [r.to_wire() for r in records]}
    workers = status.allocation.workers if status.allocation is not None else []
    classes = [w.gpu_class for w in sorted(workers, key=lambda w: w.rank)]
    if decision.model is not None and len(classes) == decision.model.size:
        patch["measured"] = measured_profile(decision.model, classes, current.version).to_wire()
    return patch
