"""What one scheduling cycle decided to write, as plain data (built by `cycle_plan`, carried out by
`writers`), so a test can read exactly what a cycle is about to do before anything is sent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_operator import plan as contract
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.launcher import ClassLaunchInfo
from hetero_operator.controller.lifecycle import JobEvent
from hetero_operator.kueue.status_patch import WorkloadChange
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus
from hetero_operator.scheduler import Decisions

Generation = tuple[str, str, int]  # (job key, job uid, allocation generation)


@dataclass(frozen=True, slots=True)
class DeletePods:
    pods: tuple[str, ...]
    force: bool = False  # on a lost node: no kubelet is left to confirm the end


@dataclass(frozen=True, slots=True)
class RequestCheckpoint:
    pods: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PublishPlan:
    """Write `plan` over the job's plan ConfigMap (a placement's or a resize's first plan)."""

    plan: contract.Plan


@dataclass(frozen=True, slots=True)
class CreateGeneration:
    """Create the objects of the job's current generation. `plan` is written only if the job has no
    plan ConfigMap (a restarted generation keeps the plan it was rebalanced to); None when the same
    write publishes the plan just before."""

    generation: int
    plan: contract.Plan | None
    classes: Mapping[str, ClassLaunchInfo] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteJob:
    """Delete the job itself (its ttlSecondsAfterFinished has passed); the finalizer's clean-up then
    removes what it owns."""


@dataclass(frozen=True, slots=True)
class PostEvent:
    event: JobEvent


@dataclass(frozen=True, slots=True)
class CreateWorkload:
    """Create the job's Kueue Workload (a 409 means it exists already), then delete `replaces`, the
    Workloads of mixes it takes the place of."""

    manifest: Mapping[str, Any]
    replaces: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return str(self.manifest["metadata"]["name"])


@dataclass(frozen=True, slots=True)
class DeleteWorkloads:
    """Workloads of the job it no longer goes by (a 404 means they are gone already)."""

    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class SetWorkloadActive:
    name: str
    active: bool  # not spec.suspend: Kueue evicts an inactive Workload and leaves it unqueued


@dataclass(frozen=True, slots=True)
class PatchWorkloadStatus:
    """One of the status changes Kueue expects from a job integration, built from the Workload as
    it is when the write runs (see `kueue.status_patch`)."""

    name: str
    change: WorkloadChange
    succeeded: bool = True
    message: str = ""


WorkloadAction = CreateWorkload | DeleteWorkloads | SetWorkloadActive | PatchWorkloadStatus
Action = (
    DeletePods | RequestCheckpoint | PublishPlan | CreateGeneration | PostEvent | DeleteJob | WorkloadAction
)


@dataclass(frozen=True, slots=True)
class JobWrite:
    """One job's writes for one cycle, in order: its status patch (when `patch` is not empty), then
    its actions. `job` carries the new status: cycles assume it until the patch is stored."""

    facts: JobFacts
    job: HeteroTrainJob
    patch: Mapping[str, Any]
    actions: tuple[Action, ...] = ()

    @property
    def status(self) -> HeteroTrainJobStatus:
        return self.job.status or HeteroTrainJobStatus()


@dataclass(frozen=True, slots=True)
class InvalidMark:
    """Valid=False naming every problem, and an InvalidSpec Event."""

    facts: JobFacts
    status: HeteroTrainJobStatus
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CleanUp:
    """A deleted job: remove what it owns (force-deleting `force_delete`, pods on nodes that are gone
    or not Ready, whose end no kubelet will confirm), then take our finalizer off."""

    facts: JobFacts
    force_delete: tuple[str, ...] = ()
    workloads: tuple[str, ...] = ()  # its Kueue Workloads: deleted at once, so their quota is free


@dataclass(frozen=True, slots=True)
class CycleCounts:
    placements: int = 0
    restarts: int = 0
    preemptions: int = 0
    first_placement_seconds: tuple[float, ...] = ()  # creation to first placement, per job


@dataclass(frozen=True)
class CyclePlan:
    writes: tuple[JobWrite, ...]
    invalid: tuple[InvalidMark, ...]
    add_finalizer: tuple[JobFacts, ...]
    clean_up: tuple[CleanUp, ...]
    decisions: Decisions
    counts: CycleCounts
    phases: Mapping[str, int]
    wake_in: float | None = None

    def write_for(self, key: str) -> JobWrite | None:
        return next((w for w in self.writes if w.facts.key == key), None)
