"""How fast a job could train on any allocation, mixed classes included: the rates that
`lower_bound` credits, from the job's true profile and the simulator's rate model (`rates`).

They hold for every allocation that keeps to the job's gang (between gpus.min and gpus.max GPUs, of
classes it allows), whatever its classes, sizes and nodes.

Data parallel. With local batches ``b_i >= 1`` summing to the global batch ``B`` (so at most ``B``
GPUs), an iteration lasts at least ``t_u + f_c(b_i)`` on every GPU,
``f_c(b) = max(alpha b + beta, alpha_sync b + beta_sync + t_o)`` (the planner's model; a lone GPU has no
all-reduce: ``t_o = t_u = 0``), so the samples/s are at most ``sum_i h_c(b_i)`` with
``h_c(b) = b / (t_u + f_c(b))``, which is concave in ``b``. For any ``lam >= 0``,
``h_c(b) - lam b <= g_c(lam)``, its largest value for ``1 <= b <= min(cap_c, B)``; an allocation of
``n >= k`` GPUs has ``B <= B n / k``; so its samples/s are at most the sum over its GPUs of

    credit_c = g_c(lam) + lam B / k,

a per-GPU credit that holds for every allocation of at least ``k`` GPUs, mixed or not. Two regimes:
one GPU (where gpus.min is 1: no all-reduce, the whole batch) and at least ``k = max(2, gpus.min)``
GPUs (with the all-reduce); a class's credit is the larger of the two. With ``lam`` the slope of ``h``
at the gang's local batch ``B / k`` on the class whose GPUs are fastest there, that class's credit is
its per-GPU rate at ``k`` GPUs (the best per-GPU rate of any single-class size); other classes get at
least theirs, more where a GPU among slower ones may take a larger share of the batch.

The peak (no allocation trains faster): the exact best single-class rate
(`rates.best_single_class_set`) where the job can only use one class; otherwise the larger of the
one-GPU rate and, over ``lam``, the least of ``lam B`` plus the best sum of ``g(lam)`` (where positive)
over ``min(gpus.max, B)`` GPUs the classes hold.

HetPipe: the planner's score (virtual workers times the slowest one's compute) is at most the sum of
all its GPUs' per-GPU rates (`rates.per_gpu_rate`), so a GPU's credit is `rates.HETPIPE_EFFICIENCY`
times its per-GPU rate, and the peak the best credit sum of gpus.max GPUs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import ClassProfile, JobRequest, MeasuredProfile, PriorModel
from hetero_operator.simulator.cluster import Cluster
from hetero_operator.simulator.rates import HETPIPE_EFFICIENCY, best_single_class_set, per_gpu_rate

# Golden-section steps when minimising the peak over the multiplier (each point is valid).
PEAK_SEARCH_STEPS = 60
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0

# One GPU's iteration time as the largest of lines ``slope * b + intercept`` (ms, b in samples).
Lines = tuple[tuple[float, float], ...]


def step_lines(profile: ClassProfile, t_o_ms: float, t_u_ms: float, *, communicates: bool) -> Lines:
    """The lines whose maximum is one GPU's iteration time at local batch ``b``."""
    if not communicates:
        return ((profile.alpha_ms, profile.beta_ms),)
    return (
        (profile.alpha_ms, profile.beta_ms + t_u_ms),
        (profile.alpha_sync_ms, profile.beta_sync_ms + t_o_ms + t_u_ms),
    )


def gpu_rate(lines: Lines, batch: float) -> float:
    """``h(b)``: samples/s of one GPU that finishes local batch ``b`` within the iteration."""
    return 1000.0 * batch / max(slope * batch + intercept for slope, intercept in lines)


def gpu_slope(lines: Lines, batch: float) -> float:
    """``h'(b)`` on the line that sets the iteration time at ``b`` (a supergradient at a kink)."""
    slope, intercept = max(lines, key=lambda line: line[0] * batch + line[1])
    return 1000.0 * intercept / (slope * batch + intercept) ** 2


def surplus(lines: Lines, largest: float, lam: float) -> float:
    """``g(lam)``: the most ``h(b) - lam b`` reaches for ``1 <= b <= largest``. The function is
    concave, so the best is at an end, a kink, or where one line's curve has slope ``lam``."""
    candidates = [1.0, largest]
    for slope, intercept in lines:
        if lam > 0 and slope > 0:
            candidates.append((math.sqrt(1000.0 * intercept / lam) - intercept) / slope)
    for (s1, i1), (s2, i2) in itertools.pairwise(lines):
        if s1 != s2:
            candidates.append((i2 - i1) / (s1 - s2))
    return max(gpu_rate(lines, b) - lam * b for b in (min(max(c, 1.0), largest) for c in candidates))


def fill(credits: Mapping[str, float], gpus: int, capacity: Mapping[str, int]) -> float:
    """The largest sum of positive credits over ``gpus`` GPUs the classes hold."""
    total, left = 0.0, gpus
    for gpu_class, credit in sorted(credits.items(), key=lambda item: -item[1]):
        taken = min(left, capacity[gpu_class]) if credit > 0 else 0
        total, left = total + taken * credit, left - taken
    return total


@dataclass(frozen=True, slots=True)
class RateShape:
    """What a data-parallel job's bounds depend on (hashable: jobs of one shape share them): its true
    profile, batch and gang, and the classes it may use that have GPUs, with their GPU counts and
    local-batch caps (``None``: no cap)."""

    profile: MeasuredProfile
    global_batch: int
    gpus_min: int
    gpus_max: int
    classes: tuple[tuple[str, int, int | None], ...]

    @classmethod
    def of(cls, job: JobRequest, capacity: Mapping[str, int]) -> RateShape:
        if job.profile is None:
            raise ValueError(f"jobs[{job.key}].profile: rate bounds need the job's true profile")
        usable = tuple(
            (c, gpus, job.max_local_batch.get(c)) for c, gpus in capacity.items() if gpus and job.allows(c)
        )
        return cls(job.profile, job.global_batch, job.gpus_min, job.gpus_max, usable)

    @property
    def capacity(self) -> dict[str, int]:
        return {c: gpus for c, gpus, _ in self.classes}

    @property
    def most_gpus(self) -> int:
        """No allocation has more GPUs than gpus.max, or than samples in the batch."""
        return min(self.gpus_max, self.global_batch)

    def largest_batch(self, cap: int | None) -> float:
        return float(self.global_batch if cap is None else min(cap, self.global_batch))

    def lines(self, *, communicates: bool) -> dict[str, tuple[Lines, float]]:
        """Per class: the iteration-time lines and the largest local batch one GPU can get."""
        profiles = dict(self.profile.per_class)
        t_o, t_u = self.profile.t_o_ms, self.profile.t_u_ms
        return {
            c: (step_lines(profiles[c], t_o, t_u, communicates=communicates), self.largest_batch(cap))
            for c, _, cap in self.classes
        }

    def alone(self) -> dict[str, float]:
        """Samples/s of one GPU holding the whole batch, on the classes where it fits (gpus.min 1)."""
        if self.gpus_min > 1:
            return {}
        profiles = dict(self.profile.per_class)
        no_comm = {c: step_lines(profiles[c], 0.0, 0.0, communicates=False) for c, _, _ in self.classes}
        return {
            c: gpu_rate(no_comm[c], self.global_batch)
            for c, _, cap in self.classes
            if cap is None or cap >= self.global_batch
        }


def gang_credits(shape: RateShape) -> dict[str, float]:
    """Per-GPU credits valid for every allocation of at least ``max(2, gpus.min)`` GPUs."""
    fewest = max(2, shape.gpus_min)
    if shape.most_gpus < fewest or not shape.classes:
        return {}
    per_class = shape.lines(communicates=True)
    batch = shape.global_batch / fewest
    fits = {c: v for c, v in per_class.items() if v[1] >= batch} or per_class
    best = max(fits, key=lambda c: gpu_rate(fits[c][0], min(batch, fits[c][1])))
    lines, largest = per_class[best]
    lam = gpu_slope(lines, min(batch, largest))
    return {c: surplus(ln, top, lam) + lam * batch for c, (ln, top) in per_class.items()}


def gang_peak(shape: RateShape) -> float:
    """An upper bound on the samples/s of any allocation of at least two GPUs (module docstring)."""
    if shape.most_gpus < max(2, shape.gpus_min) or not shape.classes:
        return 0.0
    per_class = shape.lines(communicates=True)
    capacity = shape.capacity

    def bound(lam: float) -> float:
        credits = {c: surplus(lines, top, lam) for c, (lines, top) in per_class.items()}
        return fill(credits, shape.most_gpus, capacity) + lam * shape.global_batch

    low, high = 0.0, max(gpu_slope(lines, 1.0) for lines, _ in per_class.values())
    best = min(bound(low), bound(high))
    for _ in range(PEAK_SEARCH_STEPS):
        left, right = high - GOLDEN * (high - low), low + GOLDEN * (high - low)
        at_left, at_right = bound(left), bound(right)
        best = min(best, at_left, at_right)
        if at_left <= at_right:
            high = right
        else:
            low = left
    return best


@lru_cache(maxsize=4096)
def data_parallel_bounds(shape: RateShape) -> tuple[tuple[tuple[str, float], ...], float | None]:
    """Credits per class (the larger of the one-GPU and the gang regime's), and the peak where the
    job may mix classes (``None`` where it cannot: the exact single-class peak applies)."""
    alone, gang = shape.alone(), gang_credits(shape)
    credits = {c: max(alone.get(c, 0.0), gang.get(c, 0.0)) for c, _, _ in shape.classes}
    if len(credits) < 2 or shape.most_gpus < 2:
        return tuple(credits.items()), None
    return tuple(credits.items()), max(max(alone.values(), default=0.0), gang_peak(shape))


def job_rate_bounds(job: JobRequest, cluster: Cluster, prior: PriorModel) -> tuple[dict[str, float], float]:
    """Per-GPU credits on the classes ``job`` may use (with GPUs) and its peak samples/s, from the
    request the simulator built (its true profile) on ``cluster``."""
    capacity = cluster.gpus_per_class()
    if job.strategy is Strategy.HETPIPE:
        usable = [c for c, gpus in capacity.items() if gpus and job.allows(c)]
        hetpipe = {c: HETPIPE_EFFICIENCY * per_gpu_rate(job, c) for c in usable}
        return hetpipe, fill(hetpipe, job.gpus_max, capacity)
    credits, peak = data_parallel_bounds(RateShape.of(job, capacity))
    if peak is None:
        catalog = tuple(sorted(cluster.classes, key=lambda c: c.name))
        per_node = {c: max(n.gpus_allocatable for n in cluster.nodes if n.gpu_class == c) for c, _ in credits}
        peak = best_single_class_set(job, per_node, catalog, prior)[0]
    return dict(credits), peak
