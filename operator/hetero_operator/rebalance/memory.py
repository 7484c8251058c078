"""What a job's rebalancer remembers between its looks, and when a look is due."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_operator.plan import Plan
from hetero_operator.rebalance.measurements import JobMeasurements
from hetero_operator.rebalance.step import RebalanceState
from hetero_operator.resources import HeteroTrainJob


@dataclass
class JobMemory:
    """What the job's rebalancer remembers between ticks; everything else is re-read (restart-safe)."""

    measured: dict[int, JobMeasurements] = field(default_factory=dict)  # by plan version
    plans: dict[int, Plan] = field(default_factory=dict)
    prometheus_unreachable: bool = False  # the last pass could not reach Prometheus
    prometheus_back_at: float | None = None  # monotonic time Prometheus answered after an outage
    # What was decided so far, and the watch over a settled split: frozen, replaced by each step.
    state: RebalanceState = field(default_factory=RebalanceState)


def due(job: HeteroTrainJob, epoch: int | None, memory: JobMemory) -> bool:
    """Has the job run `everyEpochs` under its newest plan (as its status says), with an epoch
    boundary still ahead, and no decision taken on that plan yet?"""
    plan = job.status.plan if job.status is not None else None
    if plan is None or epoch is None or epoch < plan.epoch + job.spec.rebalance.every_epochs:
        return False
    # The last epoch: no boundary is left for a new plan to start at, and workers that finish drop
    # out of the metrics (which is no fault of theirs).
    if job.spec.epochs and epoch + 1 >= job.spec.epochs:
        return False
    return plan.version > memory.state.last_decided_version


def watch_due(job: HeteroTrainJob, epoch: int | None, memory: JobMemory) -> bool:
    """Has the job run `everyEpochs` more since the last look at a plan already decided on (or is a
    change seen at the last look waiting to be confirmed), with an epoch boundary still ahead?"""
    plan = job.status.plan if job.status is not None else None
    if plan is None or epoch is None or plan.version != memory.state.last_decided_version:
        return False
    if job.spec.epochs and epoch + 1 >= job.spec.epochs:
        return False
    if plan.version in memory.state.watch.suspected:
        return True  # looked at every pass until the confirming window has its steps
    return epoch >= memory.state.watch.watched_epoch + job.spec.rebalance.every_epochs
