"""Heterogeneity-aware placement: which GPUs a job should get.

Candidates are a handful of class mixes, never GPU subsets: for every allowed class, the greedy mix
that starts at that class and fills down through slower classes, plus every single class that can
hold the job alone. Each mix is laid onto nodes by the free index (fewest nodes), scored by the
predicted throughput, and the best wins; candidates within ``tie_tolerance`` of the best count as
equal and then fewer nodes, the user's class preference and lower cost decide.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from hetero_operator.resources import Strategy
from hetero_operator.scheduler.free_index import ClusterState, NodeTake
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import Allocation, GPUClassInfo, JobRequest, WorkerSlot
from hetero_operator.scheduler.throughput import (
    JobShape,
    Prediction,
    PriorModel,
    predict_data_parallel,
    predict_virtual_workers,
)

ClassMix = tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Candidate:
    """A concrete GPU set for a job (on top of what it already holds) and what it would achieve.
    The worker list is built only for the candidate that wins."""

    added: tuple[NodeTake, ...]
    prediction: Prediction
    node_count: int
    cost: float
    preference: tuple[int, ...]
    class_count: int
    build: Callable[[], Allocation] = field(compare=False, repr=False)

    @cached_property
    def allocation(self) -> Allocation:
        return self.build()


@dataclass(frozen=True, slots=True)
class PlacementContext:
    """What placement needs besides the job: cluster state, catalog and model settings."""

    state: ClusterState
    catalog: tuple[GPUClassInfo, ...]
    prior: PriorModel
    tie_tolerance: float
    # A mix of classes must beat the best single-class set by this share (see `single_class_first`).
    mix_gain: float = 0.0
    # How dear a busy cluster makes GPUs of a high cost weight for a starting job (see `price_power`).
    scarcity_price: float = 0.0


def allowed_classes_fastest_first(job: JobRequest, classes: dict[str, GPUClassInfo]) -> list[str]:
    """Allowed classes that exist, fastest first; the user's preference order breaks speed ties."""
    rank = preference_ranks(job, classes)
    return sorted(
        (c for c in classes if job.allows(c)), key=lambda c: (-classes[c].relative_speed, rank[c], c)
    )


def preference_ranks(job: JobRequest, classes: dict[str, GPUClassInfo]) -> dict[str, int]:
    """0 for the most preferred class. Without a list no class is preferred: near-ties then go to
    the cheaper GPUs, leaving faster ones to jobs that gain more from them."""
    if job.allowed_classes:
        return {c: i for i, c in enumerate(job.allowed_classes)}
    return dict.fromkeys(classes, 0)


def usable_now(job: JobRequest, order: list[str], ctx: PlacementContext, budgets: Budgets) -> int:
    """GPUs the job could take right now from its classes, honouring reservations (an upper bound:
    it ignores how chunks fall on nodes)."""
    trial = budgets.copy()
    total = 0
    for gpu_class in order:
        take = min(ctx.state.free[gpu_class].usable(job.chunk), _floor(trial.room(gpu_class), job.chunk))
        if take > 0:
            trial.consume(gpu_class, take)
            total += take
    return total


def class_mixes(
    job: JobRequest, order: list[str], want: int, ctx: PlacementContext, budgets: Budgets
) -> list[ClassMix]:
    """Greedy mixes from each class down to the slowest, then single-class sets; no duplicates."""
    usable = {c: ctx.state.free[c].usable(job.chunk) for c in order}
    mixes: list[ClassMix] = []
    for start in range(len(order)):
        trial = budgets.copy()
        remaining, mix = want, []
        for gpu_class in order[start:]:
            take = min(usable[gpu_class], remaining, _floor(trial.room(gpu_class), job.chunk))
            if take > 0:
                mix.append((gpu_class, take))
                trial.consume(gpu_class, take)
                remaining -= take
            if remaining == 0:
                break
        if remaining == 0:
            mixes.append(tuple(mix))
    for gpu_class in order:
        if min(usable[gpu_class], budgets.room(gpu_class)) >= want:
            mixes.append(((gpu_class, want),))
    return list(dict.fromkeys(mixes))


def best_candidate(
    job: JobRequest,
    want: int,
    ctx: PlacementContext,
    budgets: Budgets,
    *,
    holding: Counter[str] | None = None,
    classes_allowed: frozenset[str] | None = None,
) -> Candidate | None:
    """The best way to give ``job`` ``want`` more GPUs on top of ``holding`` (node -> GPUs); ``None``
    if no candidate fits. ``classes_allowed`` narrows the job's classes (growth skips contested ones)."""
    order = allowed_classes_fastest_first(job, ctx.state.classes)
    if classes_allowed is not None:
        order = [c for c in order if c in classes_allowed]
    holding = holding or Counter()
    shape = JobShape.of(job)
    ranks = preference_ranks(job, ctx.state.classes)
    candidates: list[Candidate] = []
    for mix in class_mixes(job, order, want, ctx, budgets):
        added: list[NodeTake] = []
        for gpu_class, count in mix:
            picks = ctx.state.free[gpu_class].plan(count, job.chunk)
            if picks is None:
                break
            added.extend(picks)
        else:
            candidate = _evaluate(job, shape, holding, tuple(added), ctx, ranks)
            if candidate is not None:
                candidates.append(candidate)
    if holding or classes_allowed is not None:  # growth: the job already runs where it runs
        return choose(candidates, ctx.tie_tolerance)
    must_mix = not any(ctx.state.capacity[c] >= want for c in order)
    starting = single_class_first(candidates, ctx.mix_gain, must_mix=must_mix)
    return choose(starting, ctx.tie_tolerance, price_power(ctx))


def single_class_first(candidates: list[Candidate], mix_gain: float, *, must_mix: bool) -> list[Candidate]:
    """Drop mixes that do not beat the best one-class set by ``mix_gain``: a mix takes GPUs of a
    faster class that the job uses at the pace of its slower ones (the batch split narrows, not
    closes, the gap), and those GPUs would serve another job at full speed. When no one-class set
    is free now, the job waits for one, unless ``must_mix`` (no class is big enough to hold it)."""
    singles = [c.prediction.samples_per_second for c in candidates if c.class_count <= 1]
    if not singles:
        return candidates if must_mix else []
    floor = max(singles) * (1.0 + mix_gain)
    return [c for c in candidates if c.class_count <= 1 or c.prediction.samples_per_second >= floor]


def price_power(ctx: PlacementContext) -> float:
    """The power of its cost that divides a starting job's throughput on a candidate set:
    `scarcity_price` times the share of the cluster's GPUs in use. On an idle cluster every job takes
    the fastest GPUs for it; on a busy one a dear GPU goes to a job that gains more than its cost from
    it (as Gavel's effective throughput weighs classes), since the next job may gain more."""
    total = sum(ctx.state.capacity.values())
    if ctx.scarcity_price <= 0 or total <= 0:
        return 0.0
    free = sum(ctx.state.free[c].total_free for c in ctx.state.capacity)
    return ctx.scarcity_price * (1.0 - free / total)


def choose(candidates: list[Candidate], tie_tolerance: float, price: float = 0.0) -> Candidate | None:
    """Highest predicted throughput over cost**price (price 0: throughput alone); near-ties go to
    fewer nodes, preferred classes, lower cost."""
    if not candidates:
        return None

    def value(c: Candidate) -> float:
        speed = c.prediction.samples_per_second
        return speed / c.cost**price if price > 0 and c.cost > 0 else speed

    best = max(value(c) for c in candidates)
    close = [c for c in candidates if value(c) >= best * (1.0 - tie_tolerance)]
    return min(
        close, key=lambda c: (c.node_count, c.preference, c.cost, -c.prediction.samples_per_second, c.added)
    )


def _evaluate(
    job: JobRequest,
    shape: JobShape,
    holding: Counter[str],
    added: tuple[NodeTake, ...],
    ctx: PlacementContext,
    ranks: dict[str, int],
) -> Candidate | None:
    per_node = Counter(holding)
    for node, count in added:
        per_node[node] += count
    state = ctx.state
    classes = state.classes
    per_class: Counter[str] = Counter()
    for node, count in per_node.items():
        per_class[state.class_of(node)] += count
    build: Callable[[], Allocation]
    if job.strategy is Strategy.HETPIPE:
        built = _hetpipe_allocation(shape, per_node, ctx)
        if built is None:
            return None
        layout, prediction = built
        build = lambda: layout  # noqa: E731 - already built: the planner needed it to score
    else:
        counts = tuple((c.name, per_class[c.name]) for c in ctx.catalog if per_class[c.name])
        predicted = predict_data_parallel(shape, counts, len(per_node), ctx.catalog, ctx.prior)
        if predicted is None:
            return None
        prediction = predicted
        build = lambda: data_parallel_allocation(per_node, state)  # noqa: E731 - node classes never change
    return Candidate(
        added=added,
        prediction=prediction,
        node_count=len(per_node),
        cost=sum(count * classes[c].cost_weight for c, count in per_class.items()),
        preference=tuple(sorted(ranks[c] for c in per_class)),
        class_count=len(per_class),
        build=build,
    )


def data_parallel_allocation(per_node: Counter[str], state: ClusterState) -> Allocation:
    """One single-GPU worker per GPU; fastest class first so rank 0 sits on a fast GPU."""
    classes = state.classes

    def order(node: str) -> tuple[float, str, str]:
        gpu_class = state.class_of(node)
        return (-classes[gpu_class].relative_speed, gpu_class, node)

    workers: list[WorkerSlot] = []
    for node in sorted(per_node, key=order):
        for _ in range(per_node[node]):
            workers.append(WorkerSlot(rank=len(workers), node=node, gpu_class=state.class_of(node)))
    return Allocation(tuple(workers))


def _hetpipe_allocation(
    shape: JobShape, per_node: Counter[str], ctx: PlacementContext
) -> tuple[Allocation, Prediction] | None:
    """Virtual workers from the planner; each GPU's position inside its virtual worker is its stage."""
    state = ctx.state
    classes = state.classes

    def order(node: str) -> tuple[float, str, int, str]:
        gpu_class = state.class_of(node)
        return (-classes[gpu_class].relative_speed, gpu_class, -per_node[node], node)

    nodes = sorted(per_node, key=order)
    layout = predict_virtual_workers(
        shape, tuple((state.class_of(n), per_node[n]) for n in nodes), ctx.catalog, ctx.prior
    )
    if layout is None or sum(len(vw) for vw in layout.virtual_workers) != sum(per_node.values()):
        return None  # the planner left GPUs unused: do not claim them
    workers: list[WorkerSlot] = []
    for vw_index, virtual_worker in enumerate(layout.virtual_workers):
        for stage, (node_position, _gpu) in enumerate(virtual_worker):
            node = nodes[node_position]
            workers.append(
                WorkerSlot(
                    rank=len(workers),
                    node=node,
                    gpu_class=state.class_of(node),
                    virtual_worker=vw_index,
                    stage=stage,
                )
            )
    return Allocation(tuple(workers)), layout.prediction


def rebuild_allocation(job: JobRequest, per_node: Counter[str], ctx: PlacementContext) -> Candidate | None:
    """Allocation and prediction for exactly ``per_node`` (used when shrinking a job)."""
    shape = JobShape.of(job)
    return _evaluate(job, shape, per_node, (), ctx, preference_ranks(job, ctx.state.classes))


def _floor(value: int, chunk: int) -> int:
    return value // chunk * chunk
