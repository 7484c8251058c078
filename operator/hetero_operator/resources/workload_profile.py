"""`WorkloadProfile` (cluster-scoped): the throughput catalog's entry for one workload key, what every
job with that key measured of each GPU class, so that the next job with the key is placed and split
by measurement instead of by the classes' relativeSpeed priors."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, StringConstraints

from hetero_operator.resources.base import DNS_LABEL_PATTERN, ObjectName, WireModel
from hetero_operator.resources.job_status import MeasuredProfile

MAX_OBSERVATIONS = 16  # the most recent jobs' measurements a profile keeps

WorkloadKey = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]


class WorkloadProfileSpec(WireModel):
    """Which workload the profile describes; the operator creates one per key it has measured."""

    workload: WorkloadKey = Field(
        description="The workload key (a job's spec.workload, or the key derived from its image, command "
        "and args); also the object's name."
    )


class ProfileObservation(WireModel):
    """One job's latest measurement of itself (it replaces that job's earlier one)."""

    job: Annotated[str, StringConstraints(min_length=1, max_length=253)] = Field(
        description="namespace/name of the job that measured it."
    )
    measured_at: datetime = Field(description="When the job last measured itself.")
    measured: MeasuredProfile = Field(description="The job's per-class models and all-reduce times.")


class ClassThroughput(WireModel):
    """The catalog's estimate for one GPU of a class, as `kubectl get` shows it."""

    gpu_class: ObjectName = Field(description="The GPUClass.")
    samples_per_second: float = Field(
        ge=0, le=1e12, description="Samples per second of compute of one GPU: 1000 / computeMsPerSample."
    )
    jobs: int = Field(ge=0, le=MAX_OBSERVATIONS, description="Observations of this class the estimate uses.")


class WorkloadProfileStatus(WireModel):
    """The observations kept and the estimate the operator places and splits new jobs with."""

    observations: list[ProfileObservation] = Field(
        default_factory=list,
        max_length=MAX_OBSERVATIONS,
        description="The latest measurement of each of the most recent jobs with this key, newest last.",
    )
    estimate: MeasuredProfile | None = Field(
        default=None,
        description="Per class, each model term is the recency-weighted median over the observations "
        "that measured the class (an observation's weight halves every halfLifeHours of its age), so one "
        "outlying job cannot move it far and recent jobs count more. The all-reduce times likewise.",
    )
    throughput: list[ClassThroughput] = Field(
        default_factory=list, max_length=64, description="The estimate as samples/s of one GPU, per class."
    )
    jobs: int = Field(default=0, ge=0, le=MAX_OBSERVATIONS, description="Observations kept (one per job).")
    summary: Annotated[str, StringConstraints(max_length=1024)] = Field(
        default="", description="The throughput per class in one line, for kubectl get."
    )
    half_life_hours: float = Field(
        default=0, ge=0, le=1e6, description="The half-life the estimate was weighted with (hours)."
    )
    updated_at: datetime | None = Field(default=None, description="When the last observation arrived.")
