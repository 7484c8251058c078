"""The data of one lifecycle step: the operator's settings, what was observed of a job, and what to
do next (see `lifecycle.reconcile`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator import plan as contract
from hetero_operator.controller.facts import PodFacts
from hetero_operator.resources import HeteroTrainJob, HeteroTrainJobStatus


@settings(frozen=True)
class LifecycleConfig:
    """How jobs are stopped and how long they may take to start (the operator's settings)."""

    checkpoint_grace_seconds: Annotated[
        float,
        Field(
            ge=0,
            description="Seconds a preempted, resized or suspended job's workers get to save a checkpoint "
            "before their pods are deleted (they stop sooner once saved).",
        ),
    ] = 30.0
    start_timeout_seconds: Annotated[
        float,
        Field(
            ge=0,
            description="Default of a job's spec.startTimeoutSeconds: seconds its worker pods have to reach "
            "Running after they are created before the start is retried (0: no limit).",
        ),
    ] = 600.0


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A Kubernetes Event to post on the job."""

    type: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Step:
    """What to do for one job after looking at it once. `publish_plan`: a plan to write over the
    job's plan ConfigMap (a resized job's new split); `ensure_generation`: create the current
    generation's objects if they are missing."""

    status: HeteroTrainJobStatus
    ensure_generation: bool = False
    publish_plan: contract.Plan | None = None
    delete_pods: tuple[str, ...] = ()
    force_delete_pods: tuple[str, ...] = ()
    request_checkpoint: tuple[str, ...] = ()
    events: tuple[JobEvent, ...] = ()
    wake_in: float | None = None
    restarted: bool = False
    delete_job: bool = False  # its ttlSecondsAfterFinished has passed


@dataclass(frozen=True, slots=True)
class Observation:
    job: HeteroTrainJob
    pods: tuple[PodFacts, ...] = ()
    lost_nodes: frozenset[str] = field(default_factory=frozenset)
    now: float = 0.0
    # Per-class speeds its first plans split by: measured ones or the GPUClass priors (`job_speeds`)
    speeds: Mapping[str, float] = field(default_factory=dict)
