"""GPUs that growth lent, taken back for a starting job that would run much faster on them.

Growth hands idle GPUs to running jobs on the understanding that they are lent (see `elastic`): a
waiting queue head already shrinks those jobs back toward their gang size. A job that could start at
once on what is free would otherwise start on a slow class or a mix of classes while GPUs of a faster
class sit with jobs that grew into them, and it keeps that set for its whole run (a move needs a
whole set of a faster class idle, which a busy cluster seldom has). So before a job starts, its best
one-class set counting the lent GPUs of each class is compared with the best set free now; when the
first is faster by ``reclaim_gain``, the grown jobs give back GPUs of that class (a checkpoint-restart
each, on fewer GPUs) and the job starts there in a later cycle. GPUs that old workers are still
handing back (after such a shrink, or any resize or move) count as on their way, so the job keeps
waiting for them instead of taking the slow set in the cycles before they are free, and nobody
else is shrunk for GPUs already coming.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hetero_operator.resources import Strategy
from hetero_operator.scheduler.placement import Candidate, PlacementContext, allowed_classes_fastest_first
from hetero_operator.scheduler.queueing import PreemptionPlan, gang_size, plan_preemption
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import JobRequest
from hetero_operator.scheduler.throughput import JobShape, predict_data_parallel


@dataclass(frozen=True, slots=True)
class LentClass:
    """The class whose lent GPUs the starting job should wait for, and its throughput there."""

    gpu_class: str
    samples_per_second: float


def lent_per_class(
    job: JobRequest, running: list[JobRequest], taken: set[str], ctx: PlacementContext
) -> Counter[str]:
    """GPUs per class that jobs of ``job``'s priority or lower hold above their gang size and could
    give back (preemptible ones not already chosen to shrink or stop this cycle)."""
    state = ctx.state
    lent: Counter[str] = Counter()
    for other in running:
        if not other.preemptible or other.key in taken or other.priority > job.priority:
            continue
        if other.exact_mix is not None:
            continue  # a quota system sized it
        holding = state.held.get(other.key, Counter())
        spare = sum(holding.values()) - (gang_size(other) or other.gpus_min)
        if spare <= 0:
            continue
        per_class: Counter[str] = Counter()
        for node, count in holding.items():
            if state.is_schedulable(node):
                per_class[state.class_of(node)] += count
        for gpu_class, count in per_class.items():
            lent[gpu_class] += min(count, spare) // other.chunk * other.chunk
    return lent


def class_worth_reclaiming(
    job: JobRequest,
    now: Candidate,
    coming: Counter[str],
    ctx: PlacementContext,
    budgets: Budgets,
    gain: float,
) -> LentClass | None:
    """The job's best one-class set of as many GPUs as ``now`` (its best set among free GPUs) on free
    GPUs plus ``coming`` ones (lent, or being handed back), when it beats ``now`` by ``gain``;
    ``None`` otherwise and for pipelines (their layout is not one class). ``budgets`` (reservations,
    quotas) bound what the job may take of a class, whatever comes back."""
    want, free_now = now.allocation.total_gpus, now.prediction.samples_per_second
    if job.strategy is Strategy.HETPIPE or not coming:
        return None
    state = ctx.state
    shape = JobShape.of(job)
    best: LentClass | None = None
    for gpu_class in allowed_classes_fastest_first(job, state.classes):
        if coming[gpu_class] == 0 or reachable(job, gpu_class, coming[gpu_class], ctx, budgets) < want:
            continue
        nodes = math.ceil(want / max(1, state.largest_node[gpu_class]))
        predicted = predict_data_parallel(shape, ((gpu_class, want),), nodes, ctx.catalog, ctx.prior)
        if predicted is None:
            continue
        if best is None or predicted.samples_per_second > best.samples_per_second:
            best = LentClass(gpu_class, predicted.samples_per_second)
    if best is None or best.samples_per_second < free_now * (1.0 + gain):
        return None
    return best


def reclaim_for_start(
    job: JobRequest,
    now: Candidate,
    grown: list[JobRequest],
    taken: set[str],
    ctx: PlacementContext,
    budgets: Budgets,
    gain: float,
) -> tuple[LentClass, PreemptionPlan] | None:
    """The class worth waiting for and the ``grown`` jobs that shrink to free it (never a
    preemption: only what they grew into is taken back; none when GPUs being handed back suffice);
    ``None`` when the job should start on what is free."""
    state, want = ctx.state, now.allocation.total_gpus
    coming = lent_per_class(job, grown, taken, ctx) + state.releasing
    better = class_worth_reclaiming(job, now, coming, ctx, budgets, gain)
    if better is None:
        return None
    if reachable(job, better.gpu_class, state.releasing[better.gpu_class], ctx, budgets) >= want:
        return better, PreemptionPlan(job.key)
    plan = plan_preemption(  # it counts what is being handed back as on its way
        job,
        want,
        grown,
        taken,
        ctx,
        budgets,
        reclaim_growth=True,
        within=frozenset({better.gpu_class}),
        preempt=False,
    )
    if plan is None or plan.preemptions:
        return None
    return better, plan


def reachable(job: JobRequest, gpu_class: str, coming: int, ctx: PlacementContext, budgets: Budgets) -> int:
    """GPUs of ``gpu_class`` the job could take once ``coming`` more are free, within its budgets."""
    usable = ctx.state.free[gpu_class].usable(job.chunk) + coming // job.chunk * job.chunk
    return min(usable, max(0, budgets.room(gpu_class)) // job.chunk * job.chunk)
