"""Queue discipline: order, gang size, head reservations and preemption for a waiting head.

Jobs are served by priority (highest first), then arrival, then key, across all queues; inside a
queue the first job that cannot start is its head. A head holds back GPUs of its classes (see
`reservations`) and may make room by shrinking elastic lower-priority jobs toward their gpus.min,
then by preempting lower-priority jobs; both save a checkpoint first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.placement import (
    Candidate,
    PlacementContext,
    allowed_classes_fastest_first,
    rebuild_allocation,
    usable_now,
)
from hetero_operator.scheduler.reservations import Budgets, HeadReservation, backfill_allowance
from hetero_operator.scheduler.snapshot import JobRequest


def scheduling_order(jobs: Iterable[JobRequest]) -> list[JobRequest]:
    """Priority descending, then arrival, then key (so ties never depend on input order)."""
    return sorted(jobs, key=lambda j: (-j.priority, j.created_at, j.key))


def gang_size(job: JobRequest) -> int | None:
    """GPUs the job must get at once: gpus.min rounded up to whole virtual workers; ``None`` when no
    multiple of the virtual-worker size lies within [gpus.min, gpus.max]."""
    chunk = job.chunk
    want = -(-job.gpus_min // chunk) * chunk
    return want if want <= job.gpus_max else None


def largest_size(job: JobRequest) -> int:
    """Most GPUs worth giving: gpus.max, and never more GPUs than samples per step."""
    return min(job.gpus_max, job.global_batch) // job.chunk * job.chunk


def capacity_for(job: JobRequest, state: ClusterState) -> int:
    """Schedulable GPUs of the job's classes, free or not."""
    return sum(state.capacity[c] for c in state.classes if job.allows(c))


def head_reservation(head: JobRequest, want: int, ctx: PlacementContext) -> HeadReservation:
    """The allowance later jobs get on the head's classes (see `reservations`).

    ``free`` counts every free GPU of those classes, even ones an earlier head holds back: the
    allowance must protect the head whichever reservation is released first.
    """
    state = ctx.state
    classes = frozenset(allowed_classes_fastest_first(head, state.classes))
    free = sum(state.free[c].usable(head.chunk) for c in classes)
    holders = [_held_in(state, per_node, classes) for per_node in state.held.values()]
    holders += [gpus for gpu_class, gpus in state.others_on_schedulable_nodes() if gpu_class in classes]
    return HeadReservation(head.key, head.queue, classes, backfill_allowance(want, free, holders))


def _held_in(state: ClusterState, per_node: Counter[str], classes: frozenset[str]) -> int:
    return sum(
        count
        for node, count in per_node.items()
        if state.is_schedulable(node) and state.class_of(node) in classes
    )


@dataclass(slots=True)
class PreemptionPlan:
    """Room made for one head: new (smaller) candidates for shrunk jobs, and jobs to preempt."""

    head: str
    shrinks: dict[str, Candidate] = field(default_factory=dict)
    preemptions: list[str] = field(default_factory=list)

    @property
    def victims(self) -> list[str]:
        return [*self.shrinks, *self.preemptions]


def plan_preemption(
    head: JobRequest,
    want: int,
    running: list[JobRequest],
    taken: set[str],
    ctx: PlacementContext,
    budgets: Budgets,
    *,
    reclaim_growth: bool = False,
    within: frozenset[str] | None = None,
    preempt: bool = True,
    reclaim_from: frozenset[str] | None = None,
) -> PreemptionPlan | None:
    """Fewest lower-priority jobs to shrink or preempt so the head fits once they let go.

    ``running`` are jobs holding GPUs at the start of the cycle; ``taken`` those already chosen as
    victims for another head. With ``reclaim_growth``, jobs of the head's own priority that run
    above their gang size may be shrunk back toward it too (GPUs they grew into while idle are
    lent, not given); only lower-priority jobs are ever preempted, and only with ``preempt``.
    ``within`` limits the room to those classes (a head that must run on one class). With
    ``reclaim_from`` (the jobs of queues that borrowed quota the head's queue owns), exactly those
    jobs are preempted, whatever their priority, and nothing is shrunk. Returns ``None`` when even
    all candidates together would not do.
    """
    state = ctx.state
    classes = frozenset(allowed_classes_fastest_first(head, state.classes))
    if within is not None:
        classes &= within
    # GPUs that old workers of earlier victims are still handing back are on their way: counting
    # them keeps the head from stopping more jobs in the cycles before those have let go.
    coming = sum(state.releasing[c] for c in classes) // head.chunk * head.chunk
    short = want - usable_now(head, sorted(classes), ctx, budgets) - coming
    if short <= 0:
        return None  # enough GPUs are free or coming: the head waits on them, not on other jobs
    candidates = sorted(
        (j for j in running if j.preemptible and j.key not in taken and j.key != head.key),
        key=lambda j: (j.priority, -j.created_at, j.key),
    )
    if reclaim_from is not None:
        victims = [j for j in candidates if j.key in reclaim_from]
        shrinkable = []
    else:
        victims = [j for j in candidates if j.priority < head.priority] if preempt else []
        shrinkable = [
            j
            for j in candidates
            if j.priority < head.priority or (reclaim_growth and j.priority == head.priority)
        ]
    plan = PreemptionPlan(head.key)
    freed = 0
    released: dict[str, int] = {}
    for job in shrinkable:  # shrinking first: the job keeps running on fewer GPUs
        if freed >= short:
            break
        shrunk = _shrink(job, short - freed, classes, ctx)
        if shrunk is not None:
            candidate, count = shrunk
            plan.shrinks[job.key] = candidate
            released[job.key] = count
            freed += count
    for job in victims:
        if freed >= short:
            break
        if job.key in plan.shrinks:
            continue
        count = _held_in(state, state.held.get(job.key, Counter()), classes)
        if count > 0:
            plan.preemptions.append(job.key)
            released[job.key] = count
            freed += count
    if freed < short:
        return None
    # Drop victims the others make unnecessary, latest choice first.
    for key in reversed(plan.victims):
        if freed - released[key] >= short:
            freed -= released[key]
            plan.shrinks.pop(key, None)
            if key in plan.preemptions:
                plan.preemptions.remove(key)
    return plan


def _shrink(
    job: JobRequest, needed: int, classes: frozenset[str], ctx: PlacementContext
) -> tuple[Candidate, int] | None:
    """Release up to ``needed`` GPUs of ``classes`` (whole virtual workers), never below gpus.min:
    slowest class first, and from the nodes where the job has the fewest GPUs so nodes empty."""
    state = ctx.state
    holding = Counter(state.held.get(job.key, Counter()))
    total = sum(holding.values())
    floor = gang_size(job) or job.gpus_min
    chunk = job.chunk
    spare = (total - floor) // chunk * chunk
    if spare <= 0:
        return None
    target = min(spare, -(-needed // chunk) * chunk)
    nodes = sorted(
        (n for n in holding if state.is_schedulable(n) and state.class_of(n) in classes),
        key=lambda n: (state.classes[state.class_of(n)].relative_speed, holding[n], n),
    )
    released = 0
    for node in nodes:
        give = min(holding[node], target - released)
        holding[node] -= give
        released += give
        if holding[node] == 0:
            del holding[node]
        if released == target:
            break
    if released == 0:
        return None
    candidate = rebuild_allocation(job, holding, ctx)
    return None if candidate is None else (candidate, released)
