"""Moving running jobs onto faster GPUs that sit idle.

A job that started on a slow class because the fast ones were busy keeps its slow GPUs for the rest
of its run under a place-once scheduler; with heavy-tailed run times that is where most of the
average completion time goes. When GPUs of a faster class are idle and no waiting job could use
them, a running job moves there (checkpoint, restart on the new GPUs) if its predicted throughput
rises by at least ``min_gain``: a restart costs about a minute, a move from a K80 to a V100 saves
hours. The jobs that gain most move first, so a fast GPU goes where it is worth most.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

from hetero_operator.scheduler.elastic import pays_for_restart
from hetero_operator.scheduler.placement import (
    Candidate,
    PlacementContext,
    best_candidate,
    rebuild_allocation,
)
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import JobRequest
from hetero_operator.scheduler.throughput import class_rate_per_gpu


def per_gpu_speeds(job: JobRequest, classes: Iterable[str], ctx: PlacementContext) -> dict[str, float]:
    """One GPU's samples/s for the job at its gang-size local batch on each class, by the model the
    predictions use (`class_rate_per_gpu`): a class the job has not measured is estimated from one
    it has by the priors, so that a measured class and an unmeasured one compare in one unit (a
    prior of 1.0 is no samples/s figure)."""
    by_name = {c.name: c for c in ctx.catalog}
    return {c: class_rate_per_gpu(job, by_name[c], ctx.catalog, ctx.prior) for c in classes}


def best_move(
    job: JobRequest,
    ctx: PlacementContext,
    idle: frozenset[str],
    min_gain: float,
    restart_s: float | None = None,
) -> tuple[float, Candidate] | None:
    """The job's best one-class GPU set of its current size in ``idle`` classes it does not use, and
    its gain (new over current throughput), if the gain reaches ``1 + min_gain``. Classes are ranked
    by per-GPU speed first (cheap), and only the fastest one with room is laid out and predicted."""
    state = ctx.state
    holding = Counter(state.held.get(job.key, Counter()))
    size = sum(holding.values())
    if size == 0:
        return None
    per_class: Counter[str] = Counter()
    for node, count in holding.items():
        per_class[state.class_of(node)] += count
    room = [
        c for c in idle if c not in per_class and job.allows(c) and state.free[c].usable(job.chunk) >= size
    ]
    if not room:
        return None
    speeds = per_gpu_speeds(job, [*per_class, *room], ctx)
    pace = sum(speeds[c] * n for c, n in per_class.items()) / size
    fastest = max(room, key=lambda c: (speeds[c], c))
    if speeds[fastest] < pace * (1.0 + min_gain):
        return None
    now = rebuild_allocation(job, holding, ctx)
    moved = best_candidate(job, size, ctx, Budgets([]), classes_allowed=frozenset({fastest}))
    if now is None or moved is None:
        return None
    rate_now, rate_new = now.prediction.samples_per_second, moved.prediction.samples_per_second
    if rate_new < rate_now * (1.0 + min_gain) or not pays_for_restart(job, rate_now, rate_new, restart_s):
        return None
    return rate_new / rate_now, moved


def plan_moves(
    running: Iterable[JobRequest],
    ctx: PlacementContext,
    idle: frozenset[str],
    min_gain: float,
    limit: int,
    admits: Callable[[JobRequest, Counter[str]], bool] | None = None,
    restart_s: float | None = None,
) -> list[tuple[JobRequest, Candidate]]:
    """Up to ``limit`` moves, the largest gains first; each is scored again against what the moves
    before it took, and must pass ``admits`` (GPUs per class of the new set; quotas). A moved job's
    old GPUs stay taken for the rest of the cycle: they are free only once its pods have stopped."""
    scored = [
        (move[0], job)
        for job in running
        if (move := best_move(job, ctx, idle, min_gain, restart_s)) is not None
    ]
    scored.sort(key=lambda s: (-s[0], s[1].created_at, s[1].key))
    chosen: list[tuple[JobRequest, Candidate]] = []
    for _, job in scored[:limit]:
        move = best_move(job, ctx, idle, min_gain, restart_s)
        if move is None:
            continue
        candidate = move[1]
        if admits is not None and not admits(job, candidate.allocation.gpus_per_class()):
            continue
        for node, count in candidate.added:
            ctx.state.free[ctx.state.class_of(node)].take(node, count)
        ctx.state.held[job.key] = Counter(dict(candidate.added))
        chosen.append((job, candidate))
    return chosen
