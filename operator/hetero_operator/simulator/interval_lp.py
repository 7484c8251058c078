"""The interval-indexed relaxation behind `lower_bound`: each job's intervals, the LP, its solve.

Jobs come in as `BoundJob`s (release, work, per-GPU credits, peak rate: see `lower_bound` for what they
mean and why they bound every allocation); out comes the least mean JCT the relaxation allows.

Intervals. A global geometric grid (0, t1, t1(1+eps), ...) suits ``sum C_j`` but not the sum of
flow times ``C_j - a_j``: late in a trace its intervals grow far longer than jobs run, and the
lower-end rounding eats the whole queueing delay. Here every job sees its own geometric grid,
measured from its release: dyadic intervals (lengths ``base * 2**level``, aligned, so that coarse ones
contain finer ones) starting at most ``p_j / resolution`` long and doubling whenever the time since
release reaches ``resolution`` intervals: a growth factor of about ``2 ** (2 / resolution)`` per
interval, each interval at most about ``2 / resolution`` of the time since the job's release.
Capacity holds on every dyadic interval some job uses, counting all work inside it at any finer level
(a relaxation of capacity on the finest ones). ``resolution`` trades tightness (the rounding loses up
to about ``2 / resolution`` of each job's queueing delay: n equal jobs on one GPU get 86%, 91% and 94%
of their optimum at 4, 8 and 16) against LP size (about ``resolution / 2 + 1`` intervals per job and
doubling of its flow time, times its classes), and HiGHS's time grows faster than the LP. At the
default 8, 5,000 jobs on 2,000 GPUs build and solve in under a minute on two cores
(bench/lower_bound_scale.py); 4 takes about a third of that.

Windows. A job's intervals first reach ``window`` times ``p_j`` past its release; the rest of its
work goes to one column free of capacity and credited at the window's end (a relaxation again, so
every solve is a valid bound). Where the solution puts work there and the job's completion is above
isolation, its window grows ``WINDOW_GROWTH``-fold and the LP is solved again (``MAX_ROUNDS`` in all);
`LowerBound.beyond_window_share` reports what is left there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

DEFAULT_RESOLUTION = 8
# The LP's time unit (seconds): keeps its coefficients near 1 for hour-long jobs.
TIME_UNIT_S = 3600.0
# At most this many dyadic levels below the horizon (bounds the tree whatever the shortest job).
MAX_LEVELS = 24
# Each job's intervals first reach this many times its shortest runtime past its release.
DEFAULT_WINDOW = 2.0
# A job whose work the solution puts past its intervals gets this many times the reach, at most
# MAX_ROUNDS solves in all; work past a job's intervals is share of work > BEYOND_TOLERANCE.
WINDOW_GROWTH = 4.0
MAX_ROUNDS = 8
BEYOND_TOLERANCE = 1e-6


class BoundError(ValueError):
    """The bound cannot be computed for this trace on this cluster; the message says why."""


@dataclass(frozen=True, slots=True)
class BoundJob:
    """What the relaxation knows of one job. ``credits``: samples/s one GPU of each usable class can
    add to the job at most; ``peak_rate``: samples/s no allocation exceeds; times in seconds."""

    job_id: str
    arrival_s: float
    release_s: float
    work: float
    credits: tuple[tuple[str, float], ...]
    gpus_max: int
    peak_rate: float

    @property
    def min_runtime_s(self) -> float:
        return self.work / self.peak_rate

    @property
    def isolation_jct_s(self) -> float:
        """JCT with the cluster to itself: start-up, then its work at its peak rate."""
        return self.release_s - self.arrival_s + self.min_runtime_s


@dataclass(frozen=True, slots=True)
class LowerBound:
    """``avg_jct_s``: the bound. ``jct_s``: each job's JCT in the LP's solution (their mean is the
    bound; one job's value alone bounds nothing, but each is at least the job's isolation JCT).
    ``isolation_avg_jct_s``: the mean isolation JCT. ``variables``, ``constraints``: the last LP's
    size; ``rounds``: LPs solved; ``solve_s``: seconds to build and solve them all.
    ``beyond_window_share``: mean share of a job's work the last solution put past its window (only
    where that did not raise the job's completion above isolation, unless ``MAX_ROUNDS`` ran out)."""

    avg_jct_s: float
    isolation_avg_jct_s: float
    jct_s: Mapping[str, float]
    jobs: int
    variables: int
    constraints: int
    solve_s: float
    rounds: int
    beyond_window_share: float


@dataclass(frozen=True, slots=True)
class Grid:
    """Dyadic intervals ``[origin + i * base * 2**level, origin + (i + 1) * base * 2**level)`` for
    levels 0..``top``; ``horizon_s`` is a boundary of the top level."""

    origin_s: float
    base_s: float
    top: int
    horizon_s: float

    def length(self, level: int) -> float:
        return self.base_s * 2.0**level

    def start(self, level: int, index: int) -> float:
        return self.origin_s + index * self.length(level)

    def level_for(self, runtime_s: float, resolution: int) -> int:
        """The coarsest level whose intervals are at most ``runtime_s / resolution`` long."""
        ratio = runtime_s / (resolution * self.base_s)
        return min(self.top, max(0, math.floor(math.log2(ratio)))) if ratio > 0 else 0


@dataclass(frozen=True, slots=True)
class Interval:
    """One interval of a job's grid: where it sits in the dyadic tree, and the part of it after the
    job's release (``lower_s`` its lower end, ``length_s`` its length)."""

    level: int
    index: int
    lower_s: float
    length_s: float


# --- intervals ----------------------------------------------------------------------------------


def make_grid(jobs: Sequence[BoundJob], capacity: Mapping[str, int], resolution: int) -> Grid:
    """The dyadic grid: finest intervals ``shortest p_j / resolution`` long, and no intervals past a
    horizon far beyond any sensible schedule's end (from the first release, twice the time to the
    last release, plus all the work on the whole cluster at the best credits, plus the longest job)."""
    origin = min(j.release_s for j in jobs)
    gpus = sum(capacity.values())
    gpu_seconds = sum(j.work / max(s for _, s in j.credits) for j in jobs)
    end = max(j.release_s for j in jobs) + gpu_seconds / gpus + max(j.min_runtime_s for j in jobs)
    span = 2.0 * (end - origin)
    base = max(min(j.min_runtime_s for j in jobs) / resolution, span / 2.0**MAX_LEVELS)
    top = max(0, math.ceil(math.log2(span / (resolution * base))))
    top_length = base * 2.0**top
    return Grid(origin, base, top, origin + math.ceil(span / top_length) * top_length)


def job_intervals(job: BoundJob, grid: Grid, resolution: int, until_s: float) -> list[Interval]:
    """The job's intervals from its release to the first boundary at or after ``until_s`` (at most
    the horizon): each level until the time since release reaches ``resolution`` of its intervals
    (and the next level's boundary), then the next."""
    level = grid.level_for(job.min_runtime_s, resolution)
    index = math.floor((job.release_s - grid.origin_s) / grid.length(level))
    lower = job.release_s
    out: list[Interval] = []
    while lower < min(until_s, grid.horizon_s):
        end = grid.start(level, index + 1)
        if end > lower:
            out.append(Interval(level, index, lower, end - lower))
        lower, index = max(lower, end), index + 1
        if level < grid.top and lower - job.release_s >= resolution * grid.length(level) and index % 2 == 0:
            level, index = level + 1, index // 2
    return out


# --- the linear program -------------------------------------------------------------------------


@dataclass(slots=True)
class _Builder:
    """Columns and rows of the LP as coordinate lists (one equality and one inequality block)."""

    cost: list[float]
    lower: list[float]
    upper: list[float]
    eq: tuple[list[int], list[int], list[float]]
    eq_rhs: list[float]
    ub: tuple[list[int], list[int], list[float]]
    ub_rhs: list[float]

    @classmethod
    def empty(cls) -> _Builder:
        return cls([], [], [], ([], [], []), [], ([], [], []), [])

    def column(self, cost: float, lower: float, upper: float) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        return len(self.cost) - 1

    def row(self, entries: Sequence[tuple[int, float]], rhs: float, *, equal: bool) -> None:
        rows, cols, values = self.eq if equal else self.ub
        number = len(self.eq_rhs if equal else self.ub_rhs)
        for col, value in entries:
            rows.append(number)
            cols.append(col)
            values.append(value)
        (self.eq_rhs if equal else self.ub_rhs).append(rhs)

    def matrix(self, *, equal: bool) -> sparse.csr_matrix:
        rows, cols, values = self.eq if equal else self.ub
        shape = (len(self.eq_rhs if equal else self.ub_rhs), len(self.cost))
        return sparse.csr_matrix((values, (rows, cols)), shape=shape)


Node = tuple[str, int, int]  # (class, level, index) of a dyadic interval


def _add_job(
    lp: _Builder,
    job: BoundJob,
    intervals: Sequence[Interval],
    capacity: Mapping[str, int],
    grid: Grid,
    usage: dict[Node, list[tuple[int, float]]],
) -> int:
    """Columns and rows of one job; its work entries go to ``usage`` (by dyadic node, as a share of
    the node's capacity). Returns the column of its work after its last interval (no capacity,
    credited at that interval's end)."""
    work_row: list[tuple[int, float]] = []
    completion: list[tuple[int, float]] = []
    for interval in intervals:
        gpus: list[tuple[int, float]] = []
        offset = (interval.lower_s - job.arrival_s) / TIME_UNIT_S
        for gpu_class, credit in job.credits:
            fastest = min(job.gpus_max, capacity[gpu_class]) * credit
            most = min(fastest, job.peak_rate) * interval.length_s / job.work
            col = lp.column(0.0, 0.0, min(1.0, most))
            work_row.append((col, 1.0))
            completion.append((col, offset))
            gpu_seconds = job.work / credit
            node_capacity = capacity[gpu_class] * grid.length(interval.level)
            usage.setdefault((gpu_class, interval.level, interval.index), []).append(
                (col, gpu_seconds / node_capacity)
            )
            gpus.append((col, gpu_seconds / (job.gpus_max * interval.length_s)))
        if len(gpus) > 1:
            lp.row(gpus, 1.0, equal=False)
    window_end = intervals[-1].lower_s + intervals[-1].length_s if intervals else job.release_s
    beyond = lp.column(0.0, 0.0, 1.0)
    lp.row([*work_row, (beyond, 1.0)], 1.0, equal=True)
    flow = lp.column(1.0, job.isolation_jct_s / TIME_UNIT_S, math.inf)
    entries = [*completion, (beyond, (window_end - job.arrival_s) / TIME_UNIT_S), (flow, -1.0)]
    lp.row(entries, -job.min_runtime_s / (2.0 * TIME_UNIT_S), equal=False)
    return beyond


def _add_capacity(lp: _Builder, usage: Mapping[Node, list[tuple[int, float]]], grid: Grid) -> None:
    """One share-of-capacity column per dyadic node in use and its ancestors, at most 1: the node's
    own work plus half of each child's share (a child is half as long)."""
    nodes: set[Node] = set()
    for gpu_class, level, index in usage:
        while level <= grid.top and (gpu_class, level, index) not in nodes:
            nodes.add((gpu_class, level, index))
            level, index = level + 1, index // 2
    share = {node: lp.column(0.0, 0.0, 1.0) for node in sorted(nodes)}
    for (gpu_class, level, index), col in share.items():
        children = [(gpu_class, level - 1, 2 * index + k) for k in (0, 1)] if level > 0 else []
        entries = [(col, 1.0)]
        entries += [(share[child], -0.5) for child in children if child in share]
        entries += [(work, -value) for work, value in usage.get((gpu_class, level, index), [])]
        lp.row(entries, 0.0, equal=True)


@dataclass(frozen=True, slots=True)
class _Solution:
    mean_flow_s: float
    flows_s: list[float]
    beyond: list[float]
    variables: int
    constraints: int


def _solve(
    jobs: Sequence[BoundJob],
    capacity: Mapping[str, int],
    grid: Grid,
    resolution: int,
    until_s: Sequence[float],
) -> _Solution:
    """The relaxation with each job's intervals up to its ``until_s``, solved."""
    lp = _Builder.empty()
    usage: dict[Node, list[tuple[int, float]]] = {}
    beyond = [
        _add_job(lp, job, job_intervals(job, grid, resolution, until), capacity, grid, usage)
        for job, until in zip(jobs, until_s, strict=True)
    ]
    _add_capacity(lp, usage, grid)
    result = linprog(
        np.asarray(lp.cost) / len(jobs),
        A_ub=lp.matrix(equal=False),
        b_ub=np.asarray(lp.ub_rhs),
        A_eq=lp.matrix(equal=True),
        b_eq=np.asarray(lp.eq_rhs),
        bounds=np.column_stack([lp.lower, lp.upper]),
        method="highs",
    )
    if result.status != 0:
        raise BoundError(f"the relaxation did not solve: {result.message}")
    return _Solution(
        mean_flow_s=float(result.fun) * TIME_UNIT_S,
        flows_s=[float(result.x[b + 1]) * TIME_UNIT_S for b in beyond],
        beyond=[float(result.x[b]) for b in beyond],
        variables=len(lp.cost),
        constraints=len(lp.eq_rhs) + len(lp.ub_rhs),
    )


def lower_bound_of_jobs(
    jobs: Sequence[BoundJob],
    capacity: Mapping[str, int],
    *,
    resolution: int = DEFAULT_RESOLUTION,
    window: float = DEFAULT_WINDOW,
) -> LowerBound:
    """The bound for ``jobs`` on ``capacity`` GPUs per class (see the module docstring). Each job's
    intervals first reach ``window`` times its shortest runtime past its release; a job whose work
    the solution puts beyond them gets ``WINDOW_GROWTH`` times that, and the LP is solved again."""
    if not jobs:
        raise BoundError("jobs: the bound needs at least one job")
    if resolution < 1 or window <= 0:
        raise BoundError(f"resolution (>= 1) and window (> 0): got {resolution} and {window}")
    for job in jobs:
        if not job.credits or any(capacity.get(c, 0) < 1 for c, _ in job.credits):
            raise BoundError(f"jobs[{job.job_id}].credits: name classes with GPUs ({dict(capacity)})")
    grid = make_grid(jobs, capacity, resolution)
    reach = [window * j.min_runtime_s for j in jobs]
    started = time.perf_counter()
    rounds = 0
    while True:
        rounds += 1
        until = [job.release_s + r for job, r in zip(jobs, reach, strict=True)]
        solution = _solve(jobs, capacity, grid, resolution, until)
        short = [
            i
            for i, (job, share, flow) in enumerate(zip(jobs, solution.beyond, solution.flows_s, strict=True))
            if share > BEYOND_TOLERANCE
            and flow > job.isolation_jct_s * (1.0 + BEYOND_TOLERANCE)
            and job.release_s + reach[i] < grid.horizon_s
        ]
        if not short or rounds == MAX_ROUNDS:
            break
        for i in short:
            reach[i] *= WINDOW_GROWTH
    isolation = float(np.mean([j.isolation_jct_s for j in jobs]))
    return LowerBound(
        avg_jct_s=max(solution.mean_flow_s, isolation),  # equal but for the solver's rounding
        isolation_avg_jct_s=isolation,
        jct_s={j.job_id: f for j, f in zip(jobs, solution.flows_s, strict=True)},
        jobs=len(jobs),
        variables=solution.variables,
        constraints=solution.constraints,
        solve_s=time.perf_counter() - started,
        rounds=rounds,
        beyond_window_share=float(np.mean(solution.beyond)),
    )
