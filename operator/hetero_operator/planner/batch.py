"""Batch split for synchronous data parallelism on unequal GPUs (OptPerf of Cannikin).

Per worker i with local batch b, the time until it is ready for the last gradient bucket is

    f_i(b) = max(alpha_i*b + beta_i, alpha_sync_i*b + beta_sync_i + t_o)

(compute-bound branch, communication-bound branch) and the iteration time of a split is
``t_u + max_i f_i(b_i)``. Each f_i is increasing, convex and piecewise linear, so the real-valued
optimum is found exactly by water-filling, and the integer optimum by flooring it and handing each
leftover sample to the worker whose time grows least.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hetero_operator.planner.errors import PlanningError

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WorkerModel:
    """Linear performance model of one worker (one GPU), times in ms, batch in samples.

    ``alpha*b + beta`` is the compute time of an iteration (forward + backward + update) and
    ``alpha_sync*b + beta_sync`` the moment its first gradient bucket is ready to sync.
    """

    alpha: float
    beta: float
    alpha_sync: float
    beta_sync: float
    min_batch: int = 1
    max_batch: int | None = None
    name: str = ""

    @classmethod
    def from_components(
        cls,
        q: float,
        s: float,
        k: float,
        m: float,
        gamma: float,
        *,
        min_batch: int = 1,
        max_batch: int | None = None,
        name: str = "",
    ) -> WorkerModel:
        """Build from Cannikin's coefficients: a = q*b + s (load, forward, update), P = k*b + m
        (backward); the first bucket is ready after a + gamma*P."""
        return cls(
            alpha=q + k,
            beta=s + m,
            alpha_sync=q + gamma * k,
            beta_sync=s + gamma * m,
            min_batch=min_batch,
            max_batch=max_batch,
            name=name,
        )

    def ready_time(self, batch: float, t_o: float) -> float:
        """f_i(b): when this worker is ready for the last bucket's all-reduce."""
        return max(self.alpha * batch + self.beta, self.alpha_sync * batch + self.beta_sync + t_o)


@dataclass(frozen=True, slots=True)
class ClusterModel:
    """Workers plus the shared communication times: ``t_o`` (all buckets but the last, may overlap
    backward) and ``t_u`` (the last bucket, never overlaps)."""

    workers: tuple[WorkerModel, ...]
    t_o: float
    t_u: float
    _arrays: _Arrays = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.workers:
            raise PlanningError("workers: at least one worker is needed")
        object.__setattr__(self, "_arrays", _Arrays.build(self.workers))

    @property
    def size(self) -> int:
        return len(self.workers)

    @property
    def min_batches(self) -> IntArray:
        return self._arrays.lo.astype(np.int64)

    @property
    def max_batches(self) -> FloatArray:
        """Per-worker maximum batch, ``inf`` where unbounded."""
        return self._arrays.hi.copy()


@dataclass(frozen=True, slots=True)
class _Arrays:
    """Column view of the workers, so every evaluation is one numpy expression."""

    alpha: FloatArray
    beta: FloatArray
    alpha_sync: FloatArray
    beta_sync: FloatArray
    lo: FloatArray
    hi: FloatArray

    @staticmethod
    def build(workers: Sequence[WorkerModel]) -> _Arrays:
        def col(values: Sequence[float]) -> FloatArray:
            return np.asarray(values, dtype=np.float64)

        return _Arrays(
            alpha=col([w.alpha for w in workers]),
            beta=col([w.beta for w in workers]),
            alpha_sync=col([w.alpha_sync for w in workers]),
            beta_sync=col([w.beta_sync for w in workers]),
            lo=col([w.min_batch for w in workers]),
            hi=col([math.inf if w.max_batch is None else w.max_batch for w in workers]),
        )


@dataclass(frozen=True, slots=True)
class ContinuousSplit:
    """Exact real-valued optimum: ``opt_perf`` is the predicted iteration time (OptPerf)."""

    batches: FloatArray
    opt_perf: float
    compute_bound: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class Split:
    """Integer split with its predicted iteration time (ms)."""

    local_batches: tuple[int, ...]
    iteration_time: float


def worker_ready_times(cluster: ClusterModel, batches: ArrayLike) -> FloatArray:
    """f_i(b_i) for every worker (ms), without ``t_u``."""
    a = cluster._arrays
    b = np.asarray(batches, dtype=np.float64)
    if b.shape != a.alpha.shape:
        raise PlanningError(f"batches: expected {a.alpha.size} local batches, got {b.size}")
    return np.maximum(a.alpha * b + a.beta, a.alpha_sync * b + a.beta_sync + cluster.t_o)


def predict_iteration_time(cluster: ClusterModel, batches: ArrayLike) -> float:
    """Predicted iteration time (ms) of any split: ``t_u + max_i f_i(b_i)``."""
    return float(cluster.t_u + worker_ready_times(cluster, batches).max())


def _inverse(cluster: ClusterModel, level: float) -> FloatArray:
    """Largest real batch each worker can finish by ``level``, clamped to its [min, max]."""
    a = cluster._arrays
    with np.errstate(divide="ignore", invalid="ignore"):
        compute = _branch_inverse(level - a.beta, a.alpha)
        sync = _branch_inverse(level - cluster.t_o - a.beta_sync, a.alpha_sync)
    return np.clip(np.minimum(compute, sync), a.lo, a.hi)


def _branch_inverse(room: FloatArray, slope: FloatArray) -> FloatArray:
    """Solve slope*b <= room for the largest b; a flat branch allows any b or none."""
    flat = slope <= 0.0
    safe = np.where(flat, 1.0, slope)
    out = room / safe
    return np.where(flat, np.where(room >= 0.0, np.inf, -np.inf), out)


def _breakpoints(cluster: ClusterModel) -> FloatArray:
    """Levels where some worker's clamped inverse changes slope: f_i(min), f_i(max), f_i(b*)."""
    a = cluster._arrays
    with np.errstate(divide="ignore", invalid="ignore"):
        slope_gap = a.alpha - a.alpha_sync
        crossing = np.where(slope_gap > 0, (a.beta_sync + cluster.t_o - a.beta) / slope_gap, np.nan)
    candidates = [a.lo, a.hi, crossing]
    points = np.concatenate(candidates)
    owners = np.tile(np.arange(a.alpha.size), len(candidates))
    keep = np.isfinite(points)
    points, owners = points[keep], owners[keep]
    levels = np.maximum(
        a.alpha[owners] * points + a.beta[owners],
        a.alpha_sync[owners] * points + a.beta_sync[owners] + cluster.t_o,
    )
    return np.unique(levels)


def _check_total(cluster: ClusterModel, global_batch: float) -> None:
    a = cluster._arrays
    low, high = float(a.lo.sum()), float(a.hi.sum())
    if global_batch < low:
        raise PlanningError(
            f"global_batch: {global_batch} is below the sum of the workers' min_batch ({low:g}); "
            "raise global_batch or lower min_batch"
        )
    if global_batch > high:
        raise PlanningError(
            f"global_batch: {global_batch} is above the sum of the workers' max_batch ({high:g}); "
            "lower global_batch or raise max_batch"
        )


def continuous_split(cluster: ClusterModel, global_batch: float) -> ContinuousSplit:
    """Exact real-valued optimum of ``min max_i f_i(b_i)`` s.t. ``sum b = B``, ``min <= b <= max``.

    Water-filling: the total ``S(level) = sum_i clamp(f_i^-1(level))`` is nondecreasing and linear
    between breakpoints; binary-search the bracketing breakpoints, then solve the linear piece.
    """
    _check_total(cluster, global_batch)
    a = cluster._arrays
    points = _breakpoints(cluster)

    def total(level: float) -> float:
        return float(_inverse(cluster, level).sum())

    # First breakpoint whose total reaches B (totals are monotone and linear in between).
    lo_idx, hi_idx = 0, points.size
    while lo_idx < hi_idx:
        mid = (lo_idx + hi_idx) // 2
        if total(float(points[mid])) >= global_batch:
            hi_idx = mid
        else:
            lo_idx = mid + 1
    if lo_idx == 0:
        level = float(points[0])  # only when B equals the sum of the minimums
    else:
        start = float(points[lo_idx - 1])
        end = float(points[lo_idx]) if lo_idx < points.size else start + 1.0
        at_start, at_end = total(start), total(end)
        level = start + (global_batch - at_start) * (end - start) / (at_end - at_start)
    batches = _inverse(cluster, level)
    # Put the float residue on an interior worker so the split sums to B exactly.
    residue = global_batch - float(batches.sum())
    interior = np.flatnonzero((batches > a.lo) & (batches < a.hi))
    if interior.size:
        batches[interior[0]] += residue
    ready = worker_ready_times(cluster, batches)
    compute = a.alpha * batches + a.beta
    bound = tuple(bool(x) for x in compute >= a.alpha_sync * batches + a.beta_sync + cluster.t_o)
    return ContinuousSplit(batches=batches, opt_perf=float(cluster.t_u + ready.max()), compute_bound=bound)


def optimal_split(cluster: ClusterModel, global_batch: int) -> Split:
    """Integer split minimising the predicted iteration time, ``sum == global_batch``.

    Floors the real optimum, then gives each leftover sample to the worker whose ready time after
    taking it is smallest (optimal by an exchange argument; checked against brute force).
    """
    if global_batch != int(global_batch):
        raise PlanningError(f"global_batch: must be an integer, got {global_batch}")
    cont = continuous_split(cluster, float(global_batch))
    a = cluster._arrays
    batches = np.clip(np.floor(cont.batches + 1e-9), a.lo, a.hi).astype(np.int64)
    leftover = int(global_batch - int(batches.sum()))
    if leftover > 0:
        _hand_out(cluster, batches, leftover)
    elif leftover < 0:
        _take_back(cluster, batches, -leftover)
    return Split(
        local_batches=tuple(int(x) for x in batches),
        iteration_time=predict_iteration_time(cluster, batches),
    )


def _hand_out(cluster: ClusterModel, batches: IntArray, count: int) -> None:
    a = cluster._arrays
    nxt = worker_ready_times(cluster, batches + 1)
    open_ = batches + 1 <= a.hi
    heap = [(float(nxt[i]), int(i)) for i in np.flatnonzero(open_)]
    heapq.heapify(heap)
    workers = cluster.workers
    for _ in range(count):
        _, i = heapq.heappop(heap)
        batches[i] += 1
        if batches[i] + 1 <= a.hi[i]:
            heapq.heappush(heap, (workers[i].ready_time(float(batches[i] + 1), cluster.t_o), i))


def _take_back(cluster: ClusterModel, batches: IntArray, count: int) -> None:
    a = cluster._arrays
    for _ in range(count):
        ready = worker_ready_times(cluster, batches)
        ready[batches - 1 < a.lo] = -np.inf
        batches[int(np.argmax(ready))] -= 1


def even_split(
    global_batch: int, min_batches: Sequence[int], max_batches: Sequence[float]
) -> tuple[int, ...]:
    """Equal shares (the first ``B mod n`` workers get one more), then respect per-worker bounds."""
    n = len(min_batches)
    return proportional_split(global_batch, [1.0] * n, min_batches, max_batches)


def proportional_split(
    global_batch: int,
    weights: Sequence[float],
    min_batches: Sequence[int],
    max_batches: Sequence[float],
) -> tuple[int, ...]:
    """Integer split proportional to ``weights`` within [min, max] (largest remainders, stable order)."""
    lo = np.asarray(min_batches, dtype=np.float64)
    hi = np.asarray(max_batches, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        raise PlanningError("workers: at least one worker is needed")
    if np.any(w <= 0) or not np.all(np.isfinite(w)):
        raise PlanningError("weights: every weight must be positive and finite")
    if global_batch < lo.sum() or global_batch > hi.sum():
        raise PlanningError(
            f"global_batch: {global_batch} must lie between the sum of min_batch ({lo.sum():g}) "
            f"and the sum of max_batch ({hi.sum():g})"
        )
    # Water-fill the proportional share: b_i = clamp(c*w_i, lo, hi) with sum = B, by bisection on c.
    lo_c, hi_c = 0.0, 1.0
    while np.clip(hi_c * w, lo, hi).sum() < global_batch:
        hi_c *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo_c + hi_c)
        if mid in (lo_c, hi_c):
            break  # the interval is down to adjacent floats: more halving changes nothing
        if np.clip(mid * w, lo, hi).sum() < global_batch:
            lo_c = mid
        else:
            hi_c = mid
    share = np.clip(hi_c * w, lo, hi)
    out = np.clip(np.floor(share + 1e-9), lo, hi).astype(np.int64)
    remainder = share - out
    order = sorted(range(w.size), key=lambda i: (-remainder[i], i))
    leftover = int(global_batch - out.sum())
    for i in order:
        if leftover <= 0:
            break
        if out[i] + 1 <= hi[i]:
            out[i] += 1
            leftover -= 1
    i = 0
    while leftover > 0:  # remainders exhausted: fill round-robin where room is left
        if out[i % w.size] + 1 <= hi[i % w.size]:
            out[i % w.size] += 1
            leftover -= 1
        i += 1
    while leftover < 0:  # float residue pushed the floors over B
        j = max(range(w.size), key=lambda k: (out[k] - share[k], -k) if out[k] > lo[k] else (-np.inf, 0))
        out[j] -= 1
        leftover += 1
    return tuple(int(x) for x in out)
