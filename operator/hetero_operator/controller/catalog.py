"""The throughput catalog (pure): the workload key a job is known by, what its WorkloadProfile keeps of
each job's measurement, the estimate it gives the next job with the key, and the per-class speeds a
first plan splits by.

A job measures itself between epochs (per-class models of one GPU: compute per sample and per step,
gradient readiness, all-reduce times; `status.measured`). The catalog keeps the latest measurement of
each of the most recent jobs with a key and estimates each model term as a recency-weighted median
over them: the median, so that one outlying job (a noisy neighbour, a throttled node) cannot pull the
estimate far; recency-weighted (an observation's weight halves every half-life of its age), so that a
drift (a driver, a library, a changed model) takes over once a few new jobs have seen it."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from hetero_operator.resources import (
    HeteroTrainJobSpec,
    InvalidResourceError,
    MeasuredClass,
    MeasuredProfile,
    WorkloadProfile,
)
from hetero_operator.resources.job_spec import InitialSplit
from hetero_operator.resources.workload_profile import (
    MAX_OBSERVATIONS,
    ClassThroughput,
    ProfileObservation,
    WorkloadProfileStatus,
)

DEFAULT_HALF_LIFE_HOURS = 7 * 24.0
_KEY_PREFIX_LENGTH = 40
_NOT_KEY_CHARACTERS = re.compile(r"[^a-z0-9]+")


def workload_key(spec: HeteroTrainJobSpec) -> str:
    """`spec.workload`, else the image's last path part (tag and digest dropped) and a hash of the
    image, command, args, literal env values and strategy: the same code run the same way is the same
    workload (a pipeline measures stages, not whole models, so the strategy is part of the way)."""
    if spec.workload:
        return spec.workload
    name = spec.image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    prefix = _NOT_KEY_CHARACTERS.sub("-", name.lower()).strip("-")[:_KEY_PREFIX_LENGTH].strip("-")
    env = sorted((e.name, e.value) for e in spec.env if e.value is not None)
    strategy = spec.parallelism.strategy.value
    identity = json.dumps(
        [spec.image, list(spec.command), list(spec.args), env, strategy], separators=(",", ":")
    )
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return f"{prefix}-{digest}" if prefix else digest


def weighted_median(pairs: Iterable[tuple[float, float]]) -> float:
    """The smallest value whose cumulative weight reaches half the total ((value, weight) pairs with
    positive weights; at least one)."""
    ordered = sorted(pairs)
    total = sum(weight for _, weight in ordered)
    if not ordered or total <= 0:
        raise ValueError("weighted_median: at least one pair with a positive weight is needed")
    reached = 0.0
    for value, weight in ordered:
        reached += weight
        if reached >= total / 2:
            return value
    return ordered[-1][0]


def recency_weight(measured_at: datetime, now: datetime, half_life_hours: float) -> float:
    age_hours = max((now - measured_at).total_seconds() / 3600, 0.0)
    return math.pow(0.5, age_hours / half_life_hours) if half_life_hours > 0 else 1.0


_TERMS = ("compute_ms_per_sample", "compute_fixed_ms", "sync_ready_ms_per_sample", "sync_ready_fixed_ms")


def estimate(
    observations: Sequence[ProfileObservation], now: datetime, half_life_hours: float
) -> MeasuredProfile | None:
    """Each class's model terms and the all-reduce times, each the recency-weighted median over the
    observations that measured it (a class measured on more workers of a job weighs more)."""
    if not observations:
        return None
    weights = [recency_weight(o.measured_at, now, half_life_hours) for o in observations]
    by_class: dict[str, list[tuple[MeasuredClass, float]]] = {}
    for observation, weight in zip(observations, weights, strict=True):
        for measured in observation.measured.classes:
            by_class.setdefault(measured.gpu_class, []).append((measured, weight * measured.workers))
    classes = [
        MeasuredClass.model_validate(
            {
                "gpu_class": name,
                **{term: weighted_median((getattr(c, term), w) for c, w in entries) for term in _TERMS},
                "workers": max(c.workers for c, _ in entries),
            }
        )
        for name, entries in sorted(by_class.items())
    ]
    return MeasuredProfile(
        classes=classes,
        overlapped_allreduce_ms=weighted_median(
            (o.measured.overlapped_allreduce_ms, w) for o, w in zip(observations, weights, strict=True)
        ),
        last_bucket_allreduce_ms=weighted_median(
            (o.measured.last_bucket_allreduce_ms, w) for o, w in zip(observations, weights, strict=True)
        ),
        plan_version=0,
    )


def samples_per_second(measured: MeasuredClass) -> float:
    """Samples/s of compute of one GPU (0 when nothing was measured per sample)."""
    return 1000.0 / measured.compute_ms_per_sample if measured.compute_ms_per_sample > 0 else 0.0


def observe(
    status: WorkloadProfileStatus | None,
    job: str,
    measured: MeasuredProfile,
    at: datetime,
    half_life_hours: float = DEFAULT_HALF_LIFE_HOURS,
) -> WorkloadProfileStatus:
    """The profile after `job` measured itself at `at`: its observation replaces the job's earlier one,
    the oldest beyond the last MAX_OBSERVATIONS jobs are dropped, and the estimate is taken again."""
    earlier = [o for o in (status.observations if status is not None else []) if o.job != job]
    kept = [*earlier, ProfileObservation(job=job, measured_at=at, measured=measured)][-MAX_OBSERVATIONS:]
    found = estimate(kept, at, half_life_hours)
    throughput = [
        ClassThroughput(
            gpu_class=c.gpu_class,
            samples_per_second=round(samples_per_second(c), 3),
            jobs=sum(1 for o in kept if any(m.gpu_class == c.gpu_class for m in o.measured.classes)),
        )
        for c in (found.classes if found is not None else [])
    ]
    return WorkloadProfileStatus(
        observations=kept,
        estimate=found,
        throughput=throughput,
        jobs=len(kept),
        summary=", ".join(f"{t.gpu_class} {t.samples_per_second:.4g}/s" for t in throughput),
        half_life_hours=half_life_hours,
        updated_at=at,
    )


def known_profile(own: MeasuredProfile | None, catalog: MeasuredProfile | None) -> MeasuredProfile | None:
    """What a job's placement and first plan go by: its own measurement, else its workload's."""
    return own if own is not None and own.classes else catalog


def split_speeds(
    spec: HeteroTrainJobSpec, priors: Mapping[str, float], known: MeasuredProfile | None
) -> dict[str, float]:
    """The per-class speeds a job's first plans split by (`rebalance.initialSplit`): under `auto` the
    measured ones (`class_speeds`), else the priors."""
    if spec.rebalance.initial_split is not InitialSplit.AUTO:
        return dict(priors)
    return class_speeds(priors, known)


def class_speeds(priors: Mapping[str, float], known: MeasuredProfile | None) -> dict[str, float]:
    """Per-GPU speed per class on the priors' scale: measured classes by their measured samples/s,
    the others by their prior times the measured-over-prior ratio of the measured classes (geometric
    mean), so that only the ratios the measurement gives change. No measurement: the priors."""
    classes = known.classes if known is not None else []
    measured = {c.gpu_class: samples_per_second(c) for c in classes if c.compute_ms_per_sample > 0}
    ratios = [math.log(speed / priors[name]) for name, speed in measured.items() if priors.get(name, 0) > 0]
    if not ratios:
        return dict(priors)
    scale = math.exp(sum(ratios) / len(ratios))
    return {**priors, **{name: speed / scale for name, speed in measured.items()}}


def valid_profiles(bodies: Iterable[Mapping[str, Any]]) -> list[WorkloadProfile]:
    """The WorkloadProfiles among API bodies that parse (an invalid one is left out), by key."""
    profiles = []
    for body in bodies:
        try:
            profiles.append(WorkloadProfile.from_k8s(dict(body)))
        except InvalidResourceError:
            continue
    return sorted(profiles, key=lambda p: p.spec.workload)


def estimates(profiles: Iterable[WorkloadProfile]) -> dict[str, MeasuredProfile]:
    """Each profile's estimate by workload key (profiles not measured yet left out)."""
    return {
        p.spec.workload: p.status.estimate
        for p in profiles
        if p.status is not None and p.status.estimate is not None
    }
