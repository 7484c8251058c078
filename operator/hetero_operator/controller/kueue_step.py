"""A job labelled for Kueue, one cycle (pure): its Workload and what the scheduler may do with it.

The job's Workload carries the mix the operator proposes; until Kueue admits it the scheduler leaves
the job alone, then places its workers on exactly the admitted GPUs per class. An eviction drains
the job (checkpoint first) and, once no worker runs, hands the admission back; a finished job marks
its Workload Finished; `spec.suspend` is the Workload's `spec.active`. A Workload waiting longer
than `repropose_after_seconds` is replaced by the best mix the queue's unused quota admits now.
Every transition is read from the Workload, which the watches show, so a restarted operator picks
up where the last one stopped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator.controller.actions import (
    Action,
    CreateWorkload,
    DeleteWorkloads,
    PatchWorkloadStatus,
    PostEvent,
    RequestCheckpoint,
    SetWorkloadActive,
)
from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.job_conditions import ConditionType, is_true, set_condition
from hetero_operator.controller.job_cycle import JobCycle
from hetero_operator.controller.kueue_proposals import (
    AdmittedReason,
    WorkloadProposal,
    describe_mix,
    propose_workload,
)
from hetero_operator.controller.lifecycle import JobEvent
from hetero_operator.controller.transitions import HOLDING_PHASES, TERMINAL_PHASES, DrainReason, draining
from hetero_operator.kueue.admission import WorkloadAdmission, WorkloadPhase
from hetero_operator.kueue.constants import EvictionReason
from hetero_operator.kueue.facts import WorkloadFacts
from hetero_operator.kueue.status_patch import WorkloadChange
from hetero_operator.kueue.workload import ProposedMix, queue_name
from hetero_operator.resources import Phase
from hetero_operator.scheduler import SchedulerConfig


@settings(frozen=True)
class KueueConfig:
    """Jobs under Kueue (the operator's settings)."""

    repropose_after_seconds: Annotated[
        float,
        Field(
            ge=1,
            description="Seconds a job's Workload may wait for admission before the job asks for the best "
            "mix the queue's unused quota admits instead.",
        ),
    ] = 300.0


@dataclass(frozen=True, slots=True)
class KueueCycle:
    """What the cycle needs besides the job: the view, the time and what is under way."""

    view: ClusterView  # Kueue's objects included
    now: float
    config: KueueConfig
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)  # proposals place as it does
    grace: float = 30.0  # seconds the workers of an evicted job get to save a checkpoint
    creating: bool = False  # a Workload this job proposed is not in the watch yet
    last_cycle_at: float | None = None  # when the previous cycle ran (None: the first since start)
    busy: bool = False  # a write of this job is still on its way: no Workload writes meanwhile


@dataclass(frozen=True, slots=True)
class KueueOutcome:
    """The job after this cycle's Kueue step; `exact_mix`: GPUs per class Kueue admitted it on (the
    scheduler may place it there), None: the scheduler leaves a queued job alone."""

    item: JobCycle
    exact_mix: Mapping[str, int] | None = None
    wake_in: float | None = None


def is_submitted(item: JobCycle) -> bool:
    return queue_name(item.job) is not None


def current_workload(workloads: Sequence[WorkloadFacts]) -> WorkloadFacts | None:
    """The Workload the job goes by: one holding quota first, else the newest proposal."""

    def rank(w: WorkloadFacts) -> tuple[bool, float, str]:
        reserved = w.admission is not None and w.admission.quota_reserved
        return (reserved, w.proposed_at, w.name)

    live = [w for w in workloads if not w.deleting]
    return max(live, key=rank, default=None)


def kueue_step(item: JobCycle, cycle: KueueCycle) -> KueueOutcome:
    workloads = cycle.view.kueue.workloads_of(item.key, item.facts.uid)
    current = current_workload(workloads)
    stale = tuple(w.name for w in workloads if w is not current and not w.deleting)
    if stale and not cycle.busy:
        item = item.then((DeleteWorkloads(stale),))
    if cycle.creating:
        return KueueOutcome(item)
    if item.status.phase in TERMINAL_PHASES:
        return KueueOutcome(_finished(item, current, cycle))
    if current is None:
        return _without_workload(item, cycle)
    if current.admission is None:
        message = f"Workload {current.name} cannot be read: {current.problem}"
        return KueueOutcome(
            _admitted_condition(item, False, AdmittedReason.INVALID_WORKLOAD, message, cycle.now)
        )
    return _with_workload(item, current, current.admission, cycle)


def _with_workload(
    item: JobCycle, current: WorkloadFacts, admission: WorkloadAdmission, cycle: KueueCycle
) -> KueueOutcome:
    wanted_active = not item.job.spec.suspend
    if admission.active != wanted_active and not cycle.busy:
        item = item.then((SetWorkloadActive(current.name, wanted_active),))
    phase = admission.phase
    if phase is WorkloadPhase.EVICTED:
        return _evicted(item, current, admission, cycle)
    if phase is WorkloadPhase.ADMITTED:
        return _admitted(item, current, admission, cycle)
    if _holding(item) and not _draining(item):
        why = f"Workload {current.name} no longer holds quota ({phase.value})"
        return _evict(item, why, cycle)
    if phase is WorkloadPhase.FINISHED:
        # Marked finished by someone else while the job still has work: propose afresh.
        message = f"Workload {current.name} was marked Finished before the job ended; proposing a new one"
        item = item.then(() if cycle.busy else (DeleteWorkloads((current.name,)),))
        return KueueOutcome(
            _admitted_condition(item, False, AdmittedReason.WORKLOAD_FINISHED, message, cycle.now)
        )
    return _waiting(item, current, admission, cycle)


# --- no Workload yet ------------------------------------------------------------------------------


def _without_workload(item: JobCycle, cycle: KueueCycle) -> KueueOutcome:
    if _holding(item):
        if _draining(item):
            return KueueOutcome(item)
        return _evict(item, "its Kueue Workload is gone", cycle)
    if not _queued(item, cycle):
        return KueueOutcome(item)
    proposal = propose_workload(item, cycle.view, cycle.now, cycle.scheduler)
    if proposal.manifest is None or proposal.mix is None:
        return KueueOutcome(_admitted_condition(item, False, proposal.reason, proposal.message, cycle.now))
    return KueueOutcome(_submit(item, proposal, (), AdmittedReason.SUBMITTED, "", cycle))


def _submit(
    item: JobCycle,
    proposal: WorkloadProposal,
    replaces: tuple[str, ...],
    reason: AdmittedReason,
    preface: str,
    cycle: KueueCycle,
) -> JobCycle:
    assert proposal.mix is not None and proposal.manifest is not None
    queue = queue_name(item.job)
    message = f"{preface}Workload {proposal.name} asks LocalQueue {queue} for {describe_mix(proposal.mix)}"
    event = JobEvent("Normal", reason, message)
    item = _admitted_condition(item, False, reason, f"{message}; waiting for Kueue", cycle.now)
    return item.then((CreateWorkload(proposal.manifest, replaces), PostEvent(event)))


# --- admitted, evicted, finished ------------------------------------------------------------------


def _admitted(
    item: JobCycle, current: WorkloadFacts, admission: WorkloadAdmission, cycle: KueueCycle
) -> KueueOutcome:
    # One GPU per worker pod, as the launcher makes them: pods admitted are GPUs admitted.
    mix = {pod_set.name: pod_set.count for pod_set in admission.pod_sets}
    flavors = ", ".join(
        f"{p.name}: {p.count} on flavor {'/'.join(sorted(set(p.flavors.values()))) or '-'}"
        for p in admission.pod_sets
    )
    message = f"Kueue admitted Workload {current.name} in ClusterQueue {admission.cluster_queue} ({flavors})"
    item = _admitted_condition(item, True, AdmittedReason.ADMITTED, message, cycle.now)
    status = item.status
    if status.phase is Phase.RUNNING and not current.pods_ready and not cycle.busy:
        item = item.then((PatchWorkloadStatus(current.name, WorkloadChange.PODS_READY),))
    if _queued(item, cycle):
        return KueueOutcome(item, exact_mix=mix)
    return KueueOutcome(item)


def _evicted(
    item: JobCycle, current: WorkloadFacts, admission: WorkloadAdmission, cycle: KueueCycle
) -> KueueOutcome:
    eviction = admission.eviction
    assert eviction is not None
    why = f"Kueue evicted Workload {current.name} ({eviction.reason}: {eviction.message})"
    if _holding(item) and not _draining(item):
        return _evict(item, why, cycle)
    if _holding(item) or _live_pods(item, cycle.view):
        return KueueOutcome(_admitted_condition(item, False, AdmittedReason.EVICTED, why, cycle.now))
    after = (
        "it queues again"
        if eviction.requeues
        else "it waits for spec.active"
        if eviction.reason == EvictionReason.DEACTIVATED
        else "it waits for its queue"
    )
    message = f"{why}; the workers stopped and the quota was handed back: {after}"
    item = _admitted_condition(item, False, AdmittedReason.RELEASED, message, cycle.now)
    if cycle.busy:
        return KueueOutcome(item)
    return KueueOutcome(item.then((PatchWorkloadStatus(current.name, WorkloadChange.RELEASE),)))


def _finished(item: JobCycle, current: WorkloadFacts | None, cycle: KueueCycle) -> JobCycle:
    admission = current.admission if current is not None else None
    if current is None or admission is None or admission.finish is not None or cycle.busy:
        return item
    succeeded = item.status.phase is Phase.SUCCEEDED
    message = f"HeteroTrainJob {item.job.name} {'succeeded' if succeeded else 'failed'}"
    change = PatchWorkloadStatus(current.name, WorkloadChange.FINISH, succeeded, message)
    text = f"Workload {current.name} marked Finished: its quota is released"
    return _admitted_condition(item, False, AdmittedReason.FINISHED, text, cycle.now).then((change,))


def _evict(item: JobCycle, why: str, cycle: KueueCycle) -> KueueOutcome:
    """Checkpoint first, then back to the queue (the lifecycle finishes the drain)."""
    status = draining(item.job, DrainReason.EVICTED, why, cycle.now)
    item = item.with_status(status)
    item = _admitted_condition(item, False, AdmittedReason.EVICTED, why, cycle.now)
    event = JobEvent("Normal", DrainReason.EVICTED.value, f"{why}; saving a checkpoint first")
    pods = tuple(sorted(p.name for p in cycle.view.pods_of(item.key) if p.live and not p.deleting))
    return KueueOutcome(item.then((RequestCheckpoint(pods), PostEvent(event))), wake_in=cycle.grace)


# --- waiting for Kueue ----------------------------------------------------------------------------


def _waiting(
    item: JobCycle, current: WorkloadFacts, admission: WorkloadAdmission, cycle: KueueCycle
) -> KueueOutcome:
    queue = queue_name(item.job)
    asks = f"Workload {current.name} asks LocalQueue {queue} for {describe_mix(current.mix())}"
    if admission.phase is WorkloadPhase.INACTIVE:
        message = f"{asks}; it is inactive (spec.active is false while the job's spec.suspend is true)"
        return KueueOutcome(_admitted_condition(item, False, AdmittedReason.INACTIVE, message, cycle.now))
    if admission.phase is WorkloadPhase.QUOTA_RESERVED:
        message = (
            f"{asks}; quota is reserved in ClusterQueue {admission.cluster_queue}, admission checks pending"
        )
        return KueueOutcome(
            _admitted_condition(item, False, AdmittedReason.QUOTA_RESERVED, message, cycle.now)
        )
    kueue_says = admission.waiting_message or "waiting for Kueue"
    message = f"{asks}; {kueue_says}"
    every = cycle.config.repropose_after_seconds
    if cycle.now - current.pending_since >= every:  # looked once at least (or looks now)
        message += f"; no other mix fits the unused quota (looked again after {every:.0f} s of waiting)"
    pending = _admitted_condition(item, False, AdmittedReason.PENDING, message, cycle.now)
    if not _queued(item, cycle):
        return KueueOutcome(pending)
    due, wake = reproposal_due(current.pending_since, every, cycle.last_cycle_at, cycle.now)
    if not due:
        return KueueOutcome(pending, wake_in=wake)
    proposal = propose_workload(item, cycle.view, cycle.now, cycle.scheduler, unused_only=True)
    if proposal.mix is None or _counts(proposal.mix) == current.mix():
        return KueueOutcome(pending, wake_in=wake)
    waited = f"waited over {every:.0f} s for {describe_mix(current.mix())} ({kueue_says})"
    preface = f"Workload {current.name} {waited}; "
    return KueueOutcome(_submit(item, proposal, (current.name,), AdmittedReason.REPROPOSED, preface, cycle))


def reproposal_due(
    pending_since: float, every: float, last_cycle_at: float | None, now: float
) -> tuple[bool, float]:
    """Whether this cycle looks for another mix (once per `every` seconds of waiting: the first
    cycle past each multiple, or the first cycle after a restart once one has passed), and the
    seconds until the next look."""
    rounds = math.floor((now - pending_since) / every)
    before = math.floor((last_cycle_at - pending_since) / every) if last_cycle_at is not None else -1
    return rounds >= 1 and rounds > before, pending_since + (rounds + 1) * every - now


# --- small helpers --------------------------------------------------------------------------------


def _counts(mix: ProposedMix) -> dict[str, int]:
    return {share.gpu_class: share.workers for share in mix.shares}


def _holding(item: JobCycle) -> bool:
    allocation = item.status.allocation
    return item.status.phase in HOLDING_PHASES and allocation is not None and bool(allocation.workers)


def _draining(item: JobCycle) -> bool:
    return is_true(item.status, ConditionType.DRAINING)


def _live_pods(item: JobCycle, view: ClusterView) -> bool:
    return any(p.live for p in view.pods_of(item.key))


def _queued(item: JobCycle, cycle: KueueCycle) -> bool:
    """Waiting to be placed, with no worker left from an earlier placement."""
    return (
        item.status.phase is Phase.QUEUED and not item.job.spec.suspend and not _live_pods(item, cycle.view)
    )


def _admitted_condition(
    item: JobCycle, value: bool, reason: AdmittedReason, message: str, now: float
) -> JobCycle:
    return item.with_status(set_condition(item.status, ConditionType.ADMITTED, value, reason, message, now))


def unlabelled_cleanup(item: JobCycle, view: ClusterView) -> tuple[Action, ...]:
    """A job no longer labelled for Kueue gives up its Workloads (and their quota)."""
    names = tuple(w.name for w in view.kueue.workloads_of(item.key, item.facts.uid) if not w.deleting)
    return (DeleteWorkloads(names),) if names else ()
