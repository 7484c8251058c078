"""Elastic growth: give a job more GPUs toward gpus.max while GPUs sit idle and nobody waits.

Growth is worth a restart only when the predicted throughput rises by a margin, so the sizes tried
are few (one more chunk, doubling, everything up to the cap) and each is scored like a placement.
"""

from __future__ import annotations

from collections import Counter

from hetero_operator.scheduler.placement import (
    Candidate,
    PlacementContext,
    best_candidate,
    rebuild_allocation,
)
from hetero_operator.scheduler.queueing import largest_size
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import JobRequest


def growth_sizes(current: int, cap: int, addable: int, chunk: int) -> list[int]:
    """Extra GPUs to try: one chunk, doubling the job, and as many as fit (all whole chunks)."""
    room = min(cap - current, addable) // chunk * chunk
    if room <= 0:
        return []
    tries = {chunk, max(chunk, current // chunk * chunk), room}
    return sorted(extra for extra in tries if 0 < extra <= room)


def pays_for_restart(job: JobRequest, rate_now: float, rate_new: float, restart_s: float | None) -> bool:
    """Whether restarting a running job at ``rate_new`` saves more of its remaining time than the
    restart costs (``restart_s``); with either unknown, yes (throughput margins decide alone)."""
    if job.remaining_s is None or restart_s is None or rate_new <= 0:
        return True
    return job.remaining_s * (1.0 - rate_now / rate_new) > restart_s


def grow(
    job: JobRequest,
    holding: Counter[str],
    ctx: PlacementContext,
    classes: frozenset[str],
    min_gain: float,
    restart_s: float | None = None,
) -> Candidate | None:
    """The best larger GPU set for ``job`` using free GPUs of ``classes``, if it beats the current
    one by ``min_gain`` (relative throughput) and, for a running job, saves more time than a
    restart costs (``restart_s``, see `pays_for_restart`); ``None`` otherwise."""
    current = sum(holding.values())
    addable = sum(ctx.state.free[c].usable(job.chunk) for c in classes)
    sizes = growth_sizes(current, largest_size(job), addable, job.chunk)
    if not sizes:
        return None
    now = rebuild_allocation(job, holding, ctx)
    if now is None:
        return None
    unlimited = Budgets([])
    options = [
        candidate
        for extra in sizes
        if (candidate := best_candidate(job, extra, ctx, unlimited, holding=holding, classes_allowed=classes))
        is not None
    ]
    if not options:
        return None
    best = max(options, key=lambda c: (c.prediction.samples_per_second, -c.node_count))
    rate_now, rate_new = now.prediction.samples_per_second, best.prediction.samples_per_second
    if rate_new < rate_now * (1.0 + min_gain):
        return None
    return best if pays_for_restart(job, rate_now, rate_new, restart_s) else None
