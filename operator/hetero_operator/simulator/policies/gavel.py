"""Gavel-like: max-min fairness over effective throughput, one GPU class per job, in rounds.

Every round (six minutes, as in "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning
Workloads") a linear program picks ``X[j, c]``, the share of time job ``j`` should spend on class
``c``, maximising the smallest normalised effective throughput ``sum_c X[j, c] * T[j, c] / max_c
T[j, c]`` (then, at that minimum, the total), subject to ``sum_c X[j, c] <= 1`` per job and the GPUs
of each class. Jobs then get the round's GPUs by priority ``X[j, c]`` over the share of time they
already had on ``c``; a job that keeps its class keeps its GPUs (no restart). Jobs always run on
exactly gpus.min GPUs; throughputs ``T`` come from the same planner models the engine uses.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from hetero_operator.scheduler import (
    Allocation,
    Decisions,
    GPUClassInfo,
    JobRequest,
    Preemption,
    PriorModel,
    Snapshot,
)
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.queueing import scheduling_order
from hetero_operator.simulator.policies.base import decisions, take_one_class
from hetero_operator.simulator.rates import data_parallel_rate

ROUND_S = 360.0
# Relative slack when the second program keeps every job at the first program's minimum.
FAIRNESS_SLACK = 1e-6


@dataclass(frozen=True, slots=True)
class Pair:
    job: int
    gpu_class: str
    normalised: float


def throughput_matrix(
    jobs: list[JobRequest], snapshot: Snapshot, prior: PriorModel
) -> tuple[list[Pair], dict[str, int]]:
    """Feasible (job, class) pairs with throughput on gpus.min GPUs of the class over the job's
    best class, and the GPUs of each class."""
    catalog = tuple(sorted(snapshot.classes, key=lambda c: c.name))
    capacity: Counter[str] = Counter()
    per_node: dict[str, int] = {}
    for node in snapshot.nodes:
        if node.schedulable:
            capacity[node.gpu_class] += node.gpus_allocatable - node.gpus_used_by_others
            per_node[node.gpu_class] = max(per_node.get(node.gpu_class, 0), node.gpus_allocatable)
    pairs: list[Pair] = []
    for index, job in enumerate(jobs):
        rates: dict[str, float] = {}
        for info in catalog:
            if not job.allows(info.name) or capacity[info.name] < job.gpus_min:
                continue
            rate = _rate(job, info, per_node[info.name], catalog, prior)
            if rate is not None and rate > 0:
                rates[info.name] = rate
        best = max(rates.values(), default=0.0)
        pairs.extend(Pair(index, name, rate / best) for name, rate in rates.items())
    return pairs, dict(capacity)


def _rate(
    job: JobRequest,
    info: GPUClassInfo,
    gpus_per_node: int,
    catalog: tuple[GPUClassInfo, ...],
    prior: PriorModel,
) -> float | None:
    nodes = math.ceil(job.gpus_min / max(1, gpus_per_node))
    return data_parallel_rate(job, Counter({info.name: job.gpus_min}), nodes, catalog, prior)


def max_min_shares(jobs: list[JobRequest], pairs: list[Pair], capacity: dict[str, int]) -> np.ndarray:
    """``X`` per pair: max-min fair normalised throughput, then the most total at that minimum."""
    count = len(pairs)
    if count == 0:
        return np.zeros(0)
    gpus = np.array([jobs[p.job].gpus_min for p in pairs], dtype=float)
    value = np.array([p.normalised for p in pairs])
    job_of = np.array([p.job for p in pairs])
    classes = sorted(capacity)
    class_of = np.array([classes.index(p.gpu_class) for p in pairs])
    jobs_seen = np.unique(job_of)
    row_of_job = {j: i for i, j in enumerate(jobs_seen)}
    n_jobs = len(jobs_seen)
    cols = np.arange(count)
    job_rows = np.array([row_of_job[j] for j in job_of])
    # Rows: [t - value.x <= 0 per job] [sum x <= 1 per job] [gpus.x <= capacity per class]
    throughput_rows = coo_matrix((-value, (job_rows, cols)), shape=(n_jobs, count))
    share_rows = coo_matrix((np.ones(count), (job_rows, cols)), shape=(n_jobs, count))
    class_rows = coo_matrix((gpus, (class_of, cols)), shape=(len(classes), count))
    capacity_vec = np.array([capacity[c] for c in classes], dtype=float)
    from scipy.sparse import hstack, vstack

    t_column = coo_matrix(
        (np.ones(n_jobs), (np.arange(n_jobs), np.zeros(n_jobs, dtype=int))),
        shape=(2 * n_jobs + len(classes), 1),
    )
    body = vstack([throughput_rows, share_rows, class_rows])
    first = linprog(
        c=np.concatenate([np.zeros(count), [-1.0]]),
        A_ub=hstack([body, t_column]).tocsr(),
        b_ub=np.concatenate([np.zeros(n_jobs), np.ones(n_jobs), capacity_vec]),
        bounds=[(0.0, 1.0)] * count + [(0.0, None)],
        method="highs",
    )
    if first.status != 0:
        raise RuntimeError(f"gavel: the max-min program failed: {first.message}")
    floor = float(first.x[-1]) * (1.0 - FAIRNESS_SLACK)
    second = linprog(
        c=-value,
        A_ub=body.tocsr(),
        b_ub=np.concatenate([np.full(n_jobs, -floor), np.ones(n_jobs), capacity_vec]),
        bounds=[(0.0, 1.0)] * count,
        method="highs",
    )
    shares = second.x if second.status == 0 else first.x[:-1]
    return np.clip(np.asarray(shares, dtype=float), 0.0, 1.0)


@dataclass(slots=True)
class GavelPolicy:
    prior: PriorModel = field(default_factory=PriorModel)
    name: str = "gavel"
    pipelines: bool = False
    round_s: float | None = ROUND_S
    # Seconds each job has run on each class, and when the policy first saw it.
    received: dict[str, dict[str, float]] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(float))
    )
    first_seen: dict[str, float] = field(default_factory=dict)

    def decide(self, snapshot: Snapshot) -> Decisions:
        jobs = scheduling_order(snapshot.jobs)
        live = {j.key for j in jobs}
        for key in [k for k in self.first_seen if k not in live]:
            self.first_seen.pop(key)
            self.received.pop(key, None)
        for job in jobs:
            self.first_seen.setdefault(job.key, snapshot.now)
        pairs, capacity = throughput_matrix(jobs, snapshot, self.prior)
        shares = max_min_shares(jobs, pairs, capacity)
        round_s = self.round_s or ROUND_S
        ranked = []
        for pair, share in zip(pairs, shares, strict=True):
            if share <= 1e-6:
                continue
            job = jobs[pair.job]
            age = snapshot.now - self.first_seen[job.key] + round_s
            had = self.received[job.key][pair.gpu_class] / age
            priority = math.inf if had == 0 else share / had
            ranked.append((-priority, -share, job.created_at, job.key, pair))
        ranked.sort(key=lambda r: r[:4])
        empty = Snapshot(snapshot.classes, snapshot.nodes, (), now=snapshot.now)
        state = ClusterState(empty)
        chosen: dict[str, tuple[str, Allocation]] = {}
        for *_, pair in ranked:
            job = jobs[pair.job]
            if job.key in chosen:
                continue
            allocation = _keep(job, pair.gpu_class, state) or _take(job, pair.gpu_class, state)
            if allocation is not None:
                chosen[job.key] = (pair.gpu_class, allocation)
        place: dict[str, Allocation] = {}
        preempt: dict[str, Preemption] = {}
        waiting: dict[str, str] = {}
        for job in jobs:
            if job.key not in chosen:
                if job.current is not None:
                    preempt[job.key] = Preemption("time share ended this round")
                else:
                    waiting[job.key] = "no time share this round"
                continue
            gpu_class, allocation = chosen[job.key]
            self.received[job.key][gpu_class] += round_s
            if job.current is None:
                place[job.key] = allocation
            elif allocation != job.current:
                preempt[job.key] = Preemption(f"moving to {gpu_class}")
                place[job.key] = allocation
        return decisions(snapshot, state, place, waiting, {}, preempt=preempt)


def _keep(job: JobRequest, gpu_class: str, state: ClusterState) -> Allocation | None:
    """The job's current GPUs, if they are of ``gpu_class`` and still free this round."""
    current = job.current
    if current is None or set(current.gpus_per_class()) != {gpu_class}:
        return None
    per_node = current.gpus_per_node()
    if any(state.free[gpu_class].free_on(node) < count for node, count in per_node.items()):
        return None
    state.commit(job.key, list(per_node.items()))
    return current


def _take(job: JobRequest, gpu_class: str, state: ClusterState) -> Allocation | None:
    taken = take_one_class(state, gpu_class, job.gpus_min)
    if taken is None:
        return None
    picks, allocation = taken
    state.commit(job.key, picks)
    return allocation
