"""Each GPU class's measured speed, aggregated over the measured profiles given (pure): the throughput
catalog's estimates, one per workload.

A profile's speed on a class is its samples per millisecond of compute there: 1 / computeMsPerSample.
One profile alone says nothing about a class's absolute speed, only how its classes compare, so each
profile's ratios are put on the scale of the GPUClass priors (`relativeSpeed`): its estimate for class
c is, for every other class o it measured, speed(c) / speed(o) · relativeSpeed(o), averaged
geometrically over those o. Class c's own prior is never used, so a wrong prior shows as a measured
speed that differs from it. The class's measured speed is the median of these estimates over the
profiles, so one odd workload cannot move it far.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hetero_operator.resources import MeasuredProfile

# Three significant digits: what `kubectl get` shows anyway, and small noise rewrites no status.
SIGNIFICANT_DIGITS = 3


@dataclass(frozen=True, slots=True)
class MeasuredSpeed:
    speed: float  # on relativeSpeed's scale
    jobs: int  # the jobs whose estimates the median is taken over


def job_estimates(profile: MeasuredProfile, priors: Mapping[str, float]) -> dict[str, float]:
    """One job's estimate of each class it measured, against the other classes it measured (a job on
    one class gives none). Classes without a prior (deleted since) or without a measured per-sample
    time are left out."""
    speeds = {
        c.gpu_class: 1.0 / c.compute_ms_per_sample
        for c in profile.classes
        if c.compute_ms_per_sample > 0 and priors.get(c.gpu_class, 0.0) > 0
    }
    estimates = {}
    for name, speed in speeds.items():
        logs = [math.log(speed / other * priors[o]) for o, other in speeds.items() if o != name]
        if logs:
            estimates[name] = math.exp(sum(logs) / len(logs))
    return estimates


def measured_speeds(
    profiles: Iterable[MeasuredProfile], priors: Mapping[str, float]
) -> dict[str, MeasuredSpeed]:
    """Per class: the median of the jobs' estimates and how many jobs gave one (classes no job
    compared with another class are absent)."""
    by_class: dict[str, list[float]] = defaultdict(list)
    for profile in profiles:
        for name, estimate in job_estimates(profile, priors).items():
            by_class[name].append(estimate)
    return {
        name: MeasuredSpeed(float(f"{statistics.median(values):.{SIGNIFICANT_DIGITS}g}"), len(values))
        for name, values in sorted(by_class.items())
    }
