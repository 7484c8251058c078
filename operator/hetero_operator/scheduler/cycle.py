"""One scheduling cycle: ``schedule(snapshot) -> Decisions``, a pure function.

1. Queued jobs in priority/arrival order get their gang (gpus.min, whole virtual workers) on the
   GPU set with the best predicted throughput, within what earlier queue heads leave them.
   One that would run at least `reclaim_gain` faster on GPUs that running jobs grew into waits
   instead, while those jobs give some back (see `lent`).
2. The first job of a queue that cannot start becomes its head: it holds back GPUs of its classes
   and, if lower-priority jobs hold what it needs, those are shrunk or preempted (checkpoint first).
   With queues (see `queues`), jobs of equal priority are served by fair share (the queue whose
   speed-priced usage over its weight is lowest next, see `fair_share`) and only within the quota
   their queue may take per class.
3. When nobody waits for a class, placed and running elastic jobs grow into its idle GPUs if that
   raises their predicted throughput enough.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator.scheduler.admitted import place_admitted
from hetero_operator.scheduler.charging import Charging
from hetero_operator.scheduler.decisions import CycleMetrics, Decisions, Preemption, Resize
from hetero_operator.scheduler.elastic import grow
from hetero_operator.scheduler.fair_share import FairShare
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.lent import reclaim_for_start
from hetero_operator.scheduler.placement import (
    Candidate,
    PlacementContext,
    allowed_classes_fastest_first,
    best_candidate,
    usable_now,
)
from hetero_operator.scheduler.queueing import (
    PreemptionPlan,
    capacity_for,
    gang_size,
    head_reservation,
    largest_size,
    plan_preemption,
    scheduling_order,
)
from hetero_operator.scheduler.reasons import WaitContext, WaitReason, explain, over_quota, unknown_queue
from hetero_operator.scheduler.reservations import Budgets, HeadReservation
from hetero_operator.scheduler.snapshot import Allocation, JobRequest, Snapshot
from hetero_operator.scheduler.throughput import PriorModel
from hetero_operator.scheduler.upgrade import plan_moves


@settings(frozen=True)
class SchedulerConfig:
    """How the scheduler places, grows and preempts jobs (the operator's settings; the simulator's
    `heterotrain` policy runs exactly these defaults)."""

    prior: Annotated[PriorModel, Field(description="Performance of a job before any of it is measured.")] = (
        field(default_factory=PriorModel)
    )
    tie_tolerance: Annotated[
        float,
        Field(
            ge=0,
            le=1,
            description="Relative throughput gap treated as a tie (then fewer nodes, the job's preferred "
            "classes and cheaper GPUs win, leaving faster GPUs to jobs that gain more from them).",
        ),
    ] = 0.1
    mix_gain: Annotated[
        float,
        Field(
            ge=0,
            description="Throughput gain over the best one-class GPU set that a mix of classes must bring "
            "to be chosen (mixes always may start a job no single class can hold).",
        ),
    ] = 0.2
    scarcity_price: Annotated[
        float,
        Field(
            ge=0,
            le=4,
            description="A starting job's candidate GPU sets are ranked by throughput over cost weight "
            "to the power of this times the share of the cluster's GPUs in use: on a busy cluster a dear "
            "GPU goes to a job that gains more than its cost from it (0: the fastest set for every job).",
        ),
    ] = 0.0
    elastic: Annotated[
        bool, Field(description="Grow jobs toward gpus.max into GPUs no waiting job wants.")
    ] = True
    grow_gain_running: Annotated[
        float,
        Field(
            ge=0, description="Throughput gain that justifies growing a running job (a checkpoint-restart)."
        ),
    ] = 0.10
    grow_gain_new: Annotated[
        float, Field(ge=0, description="Throughput gain that justifies growing a job being placed now.")
    ] = 0.02
    max_growths_per_cycle: Annotated[
        int, Field(ge=0, description="Jobs considered for growth in one cycle (bounds its work).")
    ] = 64
    reclaim_growth: Annotated[
        bool,
        Field(
            description="A waiting queue head may shrink jobs of its own priority back toward their gang "
            "size (what they grew into while GPUs sat idle), not only lower-priority jobs."
        ),
    ] = True
    move_gain: Annotated[
        float | None,
        Field(
            ge=0,
            description="Move a running job onto idle GPUs of a faster class (a checkpoint-restart) when "
            "its predicted throughput rises by at least this share; unset: never move.",
        ),
    ] = 0.5
    restart_seconds: Annotated[
        float | None,
        Field(
            ge=0,
            description="What a checkpoint-restart costs a running job (its pods starting again, the "
            "checkpoint saved and restored): it is grown or moved only when that saves it more time than "
            "this on the training it has left (its status's ETA); unset: the throughput gain decides alone.",
        ),
    ] = 60.0
    reclaim_gain: Annotated[
        float | None,
        Field(
            ge=0,
            description="A job that could start now waits instead, while jobs that grew give back GPUs of "
            "a class (shrinking toward their gang size), when its best one-class set there is at least "
            "this share faster than the best set free now; unset: it starts on what is free.",
        ),
    ] = 1.0
    priority_preemption: Annotated[
        bool,
        Field(
            description="A waiting queue head may preempt lower-priority jobs (checkpoint, then restart "
            "later); off, it only shrinks jobs that grew, and waits."
        ),
    ] = True
    head_reservations: Annotated[
        bool,
        Field(
            description="Hold GPUs back for waiting queue heads (backfill never delays a head); off, later "
            "jobs take any free GPUs."
        ),
    ] = False
    charging: Annotated[
        Charging, Field(description="How queues are charged for the GPUs they hold (fair share).")
    ] = field(default_factory=Charging)


@dataclass(slots=True)
class _Outcome:
    place: dict[str, Allocation] = field(default_factory=dict)
    grow: dict[str, Resize] = field(default_factory=dict)
    shrink: dict[str, Resize] = field(default_factory=dict)
    preempt: dict[str, Preemption] = field(default_factory=dict)
    unschedulable: dict[str, WaitReason] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    waiting: list[JobRequest] = field(default_factory=list)


def schedule(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Decisions:
    """Decide placements, resizes and preemptions for one snapshot. Same snapshot, same decisions
    (input order does not matter either)."""
    config = config or SchedulerConfig()
    state = ClusterState(snapshot)
    jobs = scheduling_order(snapshot.jobs)
    running = [j for j in jobs if j.current is not None]
    queued = [j for j in jobs if j.current is None]
    ctx = PlacementContext(
        state,
        tuple(state.classes.values()),
        config.prior,
        config.tie_tolerance,
        config.mix_gain,
        # A GPU is priced only while jobs compete for it: with one job waiting, it takes the fastest.
        config.scarcity_price if len(queued) > 1 else 0.0,
    )
    out = _Outcome()
    budgets = Budgets([])
    heads: dict[str, HeadReservation] = {}
    victims: set[str] = set()
    fair = FairShare(snapshot, config.charging) if snapshot.queues else None
    # Only jobs above their gang size have GPUs to give back to a starting job (see `lent`).
    grown = [
        j for j in running if j.current is not None and j.current.total_gpus > (gang_size(j) or j.gpus_min)
    ]
    for job in fair.order(queued) if fair is not None else queued:
        _admit(job, ctx, budgets, heads, victims, running, out, config, fair, grown)
    if config.move_gain is not None:
        _move_idle(running, ctx, out, victims, config, fair)
    if config.elastic:
        _grow_idle(jobs, ctx, out, victims, config, fair)
    return Decisions(
        place=out.place,
        grow=out.grow,
        shrink=out.shrink,
        preempt=out.preempt,
        unschedulable=out.unschedulable,
        predicted_samples_per_second=out.predicted,
        metrics=_metrics(state, out),
    )


def _admit(
    job: JobRequest,
    ctx: PlacementContext,
    budgets: Budgets,
    heads: dict[str, HeadReservation],
    victims: set[str],
    running: list[JobRequest],
    out: _Outcome,
    config: SchedulerConfig,
    fair: FairShare | None,
    grown: list[JobRequest],
) -> None:
    """Place one queued job, or record why it waits (and, for a queue head, reserve and preempt)."""
    if job.exact_mix is not None:  # a quota system admitted it: exactly those GPUs, or it waits
        placed = place_admitted(job, ctx, budgets)
        if isinstance(placed, WaitReason):
            out.unschedulable[job.key] = placed
            out.waiting.append(job)
        else:
            out.place[job.key] = placed.allocation
            out.predicted[job.key] = placed.prediction.samples_per_second
            if fair is not None:
                fair.take(job, placed.allocation.gpus_per_class())
        return
    if fair is not None and not fair.knows(job.queue):
        out.unschedulable[job.key] = unknown_queue(job)
        return
    state = ctx.state
    want = gang_size(job)
    if want is None or capacity_for(job, state) < want:
        out.unschedulable[job.key] = explain(
            job, WaitContext(want, impossible=want is not None), ctx, budgets
        )
        out.waiting.append(job)
        return
    order = allowed_classes_fastest_first(job, state.classes)
    within_quota = budgets
    if fair is not None:
        room = fair.headroom(job)
        within_quota = fair.limit(job, budgets)
        if sum(min(n, state.capacity[c]) for c, n in room.items()) < want:
            # Its queue may not take a gang now. It reclaims what it lent if that is enough, else it
            # waits for its own jobs to end; either way it holds nothing back from other queues.
            plan = _reclaim(job, want, running, victims, ctx, within_quota, fair)
            if plan is not None:
                _apply_preemption(plan, job, out, running, fair, reclaiming=True)
                victims.update(plan.victims)
            out.unschedulable[job.key] = over_quota(job, want, room, tuple(plan.victims) if plan else ())
            return
    enough_free = usable_now(job, order, ctx, within_quota) >= want
    candidate = best_candidate(job, want, ctx, within_quota) if enough_free else None
    if candidate is not None and _wait_for_lent(
        job, candidate, grown, victims, ctx, within_quota, out, config, fair
    ):
        if job.queue not in heads:  # it could start now: backfill must not take that from it
            _become_head(job, want, ctx, heads, budgets, config)
        return
    if candidate is not None:
        _commit(job, candidate, ctx, budgets)
        if fair is not None:
            fair.take(job, candidate.allocation.gpus_per_class())
        out.place[job.key] = candidate.allocation
        out.predicted[job.key] = candidate.prediction.samples_per_second
        return
    out.waiting.append(job)
    head = heads.get(job.queue)
    if head is not None:
        wait = WaitContext(want, behind=head.job, enough_free_but_no_layout=enough_free)
        out.unschedulable[job.key] = explain(job, wait, ctx, budgets)
        return
    plan = _make_room(job, want, order, running, victims, ctx, within_quota, config)
    reclaiming = False
    if plan is None and fair is not None:
        plan = _reclaim(job, want, running, victims, ctx, within_quota, fair)
        reclaiming = plan is not None
    if plan is not None:
        _apply_preemption(plan, job, out, running, fair, reclaiming=reclaiming)
        victims.update(plan.victims)
    wait = WaitContext(
        want,
        preempting=tuple(plan.victims) if plan else (),
        enough_free_but_no_layout=enough_free,
        reclaiming=reclaiming,
    )
    out.unschedulable[job.key] = explain(job, wait, ctx, budgets)
    _become_head(job, want, ctx, heads, budgets, config)


def _become_head(
    job: JobRequest,
    want: int,
    ctx: PlacementContext,
    heads: dict[str, HeadReservation],
    budgets: Budgets,
    config: SchedulerConfig,
) -> None:
    """``job`` is the first of its queue to wait: later jobs of the queue wait behind it, and with
    head reservations on, backfill may not take what it needs."""
    reservation = head_reservation(job, want, ctx)
    heads[job.queue] = reservation
    if config.head_reservations:
        budgets.add(reservation)


def _wait_for_lent(
    job: JobRequest,
    candidate: Candidate,
    grown: list[JobRequest],
    victims: set[str],
    ctx: PlacementContext,
    budgets: Budgets,
    out: _Outcome,
    config: SchedulerConfig,
    fair: FairShare | None,
) -> bool:
    """Whether ``job`` waits for GPUs that grown jobs give back (see `lent`) rather than take
    ``candidate``; if so, their shrinks are decided."""
    if config.reclaim_gain is None:
        return False
    found = reclaim_for_start(job, candidate, grown, victims, ctx, budgets, config.reclaim_gain)
    if found is None:
        return False
    better, plan = found
    if plan.victims:
        _apply_preemption(plan, job, out, grown, fair)
    victims.update(plan.victims)
    out.waiting.append(job)
    faster = (better.gpu_class, better.samples_per_second / candidate.prediction.samples_per_second)
    wait = WaitContext(candidate.allocation.total_gpus, preempting=tuple(plan.victims), faster_on=faster)
    out.unschedulable[job.key] = explain(job, wait, ctx, budgets)
    return True


def _make_room(
    head: JobRequest,
    want: int,
    order: list[str],
    running: list[JobRequest],
    victims: set[str],
    ctx: PlacementContext,
    budgets: Budgets,
    config: SchedulerConfig,
) -> PreemptionPlan | None:
    """Room for a waiting head on one class it fits (fastest first), as placement wants it; on any
    mix of its classes only when no single class can hold it."""
    whole = [c for c in order if ctx.state.capacity[c] >= want]
    # One class at a time, fastest first; any mix of its classes only when no single class can hold it.
    scopes: list[frozenset[str] | None] = [frozenset({c}) for c in whole] if whole else [None]
    for within in scopes:
        plan = plan_preemption(
            head,
            want,
            running,
            victims,
            ctx,
            budgets,
            reclaim_growth=config.reclaim_growth,
            within=within,
            preempt=config.priority_preemption,
        )
        if plan is not None:
            return plan
    return None


def _reclaim(
    head: JobRequest,
    want: int,
    running: list[JobRequest],
    victims: set[str],
    ctx: PlacementContext,
    budgets: Budgets,
    fair: FairShare,
) -> PreemptionPlan | None:
    """Room for a head whose queue is owed nominal GPUs that other queues borrowed: their jobs on
    those classes are preempted (checkpoint first), whatever their priority."""
    classes, borrowers = fair.reclaimable(head, running)
    if not borrowers:
        return None
    return plan_preemption(head, want, running, victims, ctx, budgets, within=classes, reclaim_from=borrowers)


def _commit(job: JobRequest, candidate: Candidate, ctx: PlacementContext, budgets: Budgets) -> None:
    ctx.state.commit(job.key, list(candidate.added))
    for node, count in candidate.added:
        budgets.commit(ctx.state.class_of(node), count)


def _apply_preemption(
    plan: PreemptionPlan,
    head: JobRequest,
    out: _Outcome,
    running: list[JobRequest],
    fair: FairShare | None,
    *,
    reclaiming: bool = False,
) -> None:
    why = (
        f"queue {head.queue} reclaims the GPUs of its quota it lent, for {head.key}"
        if reclaiming
        else f"making room for {head.key} (priority {head.priority}) in queue {head.queue}"
    )
    by_key = {j.key: j for j in running}
    for key, candidate in plan.shrinks.items():
        out.shrink[key] = Resize(
            candidate.allocation, f"shrunk to {candidate.allocation.total_gpus} GPUs, {why}"
        )
        out.predicted[key] = candidate.prediction.samples_per_second
        if fair is not None:
            job = by_key[key]
            released = _held_classes(job) - candidate.allocation.gpus_per_class()
            fair.give_back(job, released)
    for key in plan.preemptions:
        out.preempt[key] = Preemption(f"preempted, {why}")
        if fair is not None:
            fair.give_back(by_key[key], _held_classes(by_key[key]))


def _held_classes(job: JobRequest) -> Counter[str]:
    return job.current.gpus_per_class() if job.current is not None else Counter()


def _idle_classes(ctx: PlacementContext, out: _Outcome) -> frozenset[str]:
    """Classes with free GPUs that no waiting job could use (waiting jobs that can never start aside)."""
    state = ctx.state
    contested: set[str] = set()
    for job in out.waiting:
        want = gang_size(job)
        if want is not None and capacity_for(job, state) >= want:
            contested.update(c for c in state.classes if job.allows(c))
    return frozenset(c for c in state.classes if c not in contested and state.free[c].total_free > 0)


def _move_idle(
    running: list[JobRequest],
    ctx: PlacementContext,
    out: _Outcome,
    victims: set[str],
    config: SchedulerConfig,
    fair: FairShare | None = None,
) -> None:
    """Move running jobs onto idle GPUs of a faster class (see `upgrade`)."""
    idle = _idle_classes(ctx, out)
    if not idle or config.move_gain is None:
        return
    movable = [j for j in running if j.preemptible and j.exact_mix is None and j.key not in victims]
    admits = None if fair is None else _admits_move(fair)
    moves = plan_moves(
        movable, ctx, idle, config.move_gain, config.max_growths_per_cycle, admits, config.restart_seconds
    )
    for job, candidate in moves:
        victims.add(job.key)  # it restarts this cycle: nothing else resizes it
        out.predicted[job.key] = candidate.prediction.samples_per_second
        classes = ", ".join(sorted(candidate.allocation.gpus_per_class()))
        out.grow[job.key] = Resize(candidate.allocation, f"moved to idle {classes} GPUs (faster)")


def _admits_move(fair: FairShare) -> Callable[[JobRequest, Counter[str]], bool]:
    """A move passes when the job's queue may hold its new GPUs once its old ones are given back
    (borrowing included: GPUs that sit idle are lent, and reclaimed when their owner needs them)."""

    def admits(job: JobRequest, new: Counter[str]) -> bool:
        old = _held_classes(job)
        fair.give_back(job, old)
        if fair.fits(job, new):
            fair.take(job, new)
            return True
        fair.take(job, old)
        return False

    return admits


def _grow_idle(
    jobs: list[JobRequest],
    ctx: PlacementContext,
    out: _Outcome,
    victims: set[str],
    config: SchedulerConfig,
    fair: FairShare | None = None,
) -> None:
    """Grow jobs into classes no waiting job could use."""
    state = ctx.state
    idle = _idle_classes(ctx, out)
    if not idle:
        return
    tried = 0
    for job in jobs:
        if tried >= config.max_growths_per_cycle:
            break
        is_new = job.key in out.place
        if not (is_new or (job.current is not None and job.preemptible)) or job.key in victims:
            continue
        if job.exact_mix is not None:  # its size is the quota system's
            continue
        classes = frozenset(c for c in idle if job.allows(c))
        if not classes or not any(state.free[c].usable(job.chunk) for c in classes):
            continue
        holding = Counter(state.held[job.key])
        if sum(holding.values()) + job.chunk > largest_size(job):
            continue  # at its cap already: no try spent on it
        tried += 1
        gain = config.grow_gain_new if is_new else config.grow_gain_running
        candidate = grow(job, holding, ctx, classes, gain, None if is_new else config.restart_seconds)
        if candidate is None:
            continue
        if fair is not None:
            added: Counter[str] = Counter()
            for node, count in candidate.added:
                added[state.class_of(node)] += count
            if not fair.fits(job, added):
                continue
            fair.take(job, added)
        state.commit(job.key, list(candidate.added))
        out.predicted[job.key] = candidate.prediction.samples_per_second
        if is_new:
            out.place[job.key] = candidate.allocation
        else:
            out.grow[job.key] = Resize(
                candidate.allocation, f"grown to {candidate.allocation.total_gpus} GPUs while GPUs sit idle"
            )


def _metrics(state: ClusterState, out: _Outcome) -> CycleMetrics:
    allocated: Counter[str] = Counter({c: 0 for c in state.classes})
    for per_node in state.held.values():
        for node, count in per_node.items():
            allocated[state.class_of(node)] += count
    queue_length: Counter[str] = Counter(job.queue for job in out.waiting)
    return CycleMetrics(
        queue_length=dict(sorted(queue_length.items())),
        gpus_allocated=dict(allocated),
        gpus_free=state.free_gpus(),
        jobs_placed=len(out.place),
        jobs_preempted=len(out.preempt),
        jobs_resized=len(out.grow) + len(out.shrink),
    )
