"""Fair-share charging: what holding GPUs costs a queue, and the share that orders queues.

Usage is charged in reference-GPU seconds: GPU seconds times the speed of that class *for that
job* (its measured speed once it has run there, the class's `relativeSpeed` prior before). So a job
moved to a class three times faster for it costs three times as much per second, exactly what it
gains, and a tenant cannot win share by holding fast GPUs its models barely use.

The reference GPU is the job's own average GPU of the cluster: speeds are divided by the job's speed
on an equal slice of every class (as Gavel normalises throughput by the equal-share allocation). A
tenant whose models run fast everywhere is then not charged for being fast, only for holding the
GPUs that are fast *for it*, and a tenant that holds exactly its slice of every class is charged one
per GPU, whatever its models; this is what finish-time fairness (JCT against a 1/N slice) measures.
The two simpler prices, a fixed weight per class and plain GPU counts, stay selectable.

Usage decays with a half-life (old usage matters less), integrated exactly between cycles by
`accrue`, the one function the operator and the simulator both call. A queue's share is its
decayed usage plus what it holds now projected over the decay's time constant, over its weight:
holding a constant rate ``r`` long enough makes the decayed usage ``r * tau``, so both terms are in
the same unit and a placement raises the share at once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator.scheduler.queues import QueueInfo
from hetero_operator.scheduler.snapshot import GPUClassInfo, JobRequest


class Pricing(StrEnum):
    SPEED = "speed"  # the job's speed on the class (measured, else the class prior)
    CLASS = "class"  # the class's relativeSpeed, whatever runs on it
    GPU = "gpu"  # every GPU costs 1


@settings(frozen=True)
class Charging:
    """How usage is priced and forgotten."""

    pricing: Annotated[Pricing, Field(description="What one GPU-second costs a queue.")] = Pricing.SPEED
    half_life_s: Annotated[float, Field(gt=0, description="Charged usage halves every so many seconds.")] = (
        3600.0
    )

    @property
    def tau_s(self) -> float:
        """Time constant of the decay: a constant rate r settles at decayed usage r * tau."""
        return self.half_life_s / math.log(2)


def job_speed(job: JobRequest, gpu_class: str, classes: Mapping[str, GPUClassInfo]) -> float:
    """Reference GPUs one GPU of ``gpu_class`` is worth to ``job``.

    Measured rates (samples/s per GPU at the job's reference local batch) are put on the reference
    scale by the measured class whose prior is 1.0 when there is one, else by the geometric mean of
    measured-over-prior across the measured classes; an unmeasured class keeps its prior."""
    prior = classes[gpu_class].relative_speed
    if job.profile is None:
        return prior
    batch = job.global_batch / job.gpus_min
    rates = {
        name: batch / (p.alpha_ms * batch + p.beta_ms) for name, p in job.profile.per_class if name in classes
    }
    if gpu_class not in rates:
        return prior
    reference = [rate for name, rate in rates.items() if classes[name].relative_speed == 1.0]
    if reference:
        anchor = reference[0]
    else:
        logs = [math.log(rate / classes[name].relative_speed) for name, rate in rates.items()]
        anchor = math.exp(sum(logs) / len(logs))
    return rates[gpu_class] / anchor


def equal_share_speed(
    job: JobRequest, classes: Mapping[str, GPUClassInfo], capacity: Mapping[str, int]
) -> float:
    """The job's speed per GPU averaged over the cluster's GPUs of the classes it may use: what an
    equal slice of every class is worth to it per GPU (1.0 when it may use none)."""
    allowed = [c for c in classes if job.allows(c) and capacity.get(c, 0) > 0]
    total = sum(capacity[c] for c in allowed)
    if total == 0:
        return 1.0
    return sum(capacity[c] * job_speed(job, c, classes) for c in allowed) / total


def price(
    job: JobRequest,
    gpu_class: str,
    classes: Mapping[str, GPUClassInfo],
    capacity: Mapping[str, int],
    pricing: Pricing,
) -> float:
    """What one GPU-second of ``gpu_class`` held by ``job`` costs its queue (``capacity``: GPUs per
    class in the cluster, for the speed price's reference)."""
    if pricing is Pricing.GPU:
        return 1.0
    if pricing is Pricing.CLASS:
        return classes[gpu_class].relative_speed
    return job_speed(job, gpu_class, classes) / equal_share_speed(job, classes, capacity)


def charge_rate(
    job: JobRequest,
    gpus_per_class: Mapping[str, int],
    classes: Mapping[str, GPUClassInfo],
    capacity: Mapping[str, int],
    pricing: Pricing,
) -> float:
    """Reference-GPU seconds per second the job is charged for holding these GPUs."""
    return sum(count * price(job, c, classes, capacity, pricing) for c, count in gpus_per_class.items())


def accrue(usage: float, rate: float, elapsed_s: float, charging: Charging) -> float:
    """Usage after ``elapsed_s`` seconds charged at a constant ``rate``, decaying all along:
    the exact solution of du/dt = rate - u / tau."""
    if elapsed_s <= 0:
        return usage
    keep = math.exp(-elapsed_s / charging.tau_s)
    return usage * keep + rate * charging.tau_s * (1.0 - keep)


def share(queue: QueueInfo, held_rate: float, charging: Charging) -> float:
    """The fair-share key: lower goes first."""
    return (queue.usage + held_rate * charging.tau_s) / queue.weight


def held_rates(
    holdings: Iterable[tuple[JobRequest, Mapping[str, int]]],
    classes: Mapping[str, GPUClassInfo],
    capacity: Mapping[str, int],
    pricing: Pricing,
) -> dict[str, float]:
    """Charge rate per queue of the jobs holding GPUs."""
    rates: dict[str, float] = {}
    for job, gpus in holdings:
        rates[job.queue] = rates.get(job.queue, 0.0) + charge_rate(job, gpus, classes, capacity, pricing)
    return rates
