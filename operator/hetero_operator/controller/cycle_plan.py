"""One scheduling cycle as pure functions: a view of the cluster in, a `CyclePlan` of writes out.

`prepare` steps every job's lifecycle and builds the scheduler's snapshot; the caller runs the pure
`schedule()` on it (and times it); `finish` applies the decisions and returns, per job, the one
status patch and the actions that follow it. Nothing here awaits, reads a clock or talks to the API
server: what is in flight (creations, finalizers, clean-ups, writes on a job's chain) comes in as
data, so the same view always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from hetero_operator import plan as contract
from hetero_operator.controller import names
from hetero_operator.controller.actions import (
    Action,
    CleanUp,
    CreateGeneration,
    CycleCounts,
    CyclePlan,
    DeleteJob,
    DeletePods,
    Generation,
    InvalidMark,
    PostEvent,
    PublishPlan,
    RequestCheckpoint,
)
from hetero_operator.controller.decision_effects import apply_decisions
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.inventory import ClusterView, build_snapshot, job_request
from hetero_operator.controller.job_conditions import ConditionType, is_true
from hetero_operator.controller.job_cycle import JobCycle, arrival_times, phase_counts
from hetero_operator.controller.kueue_step import (
    KueueConfig,
    KueueCycle,
    KueueOutcome,
    is_submitted,
    kueue_step,
    unlabelled_cleanup,
)
from hetero_operator.controller.launcher import LaunchOptions
from hetero_operator.controller.lifecycle import (
    LifecycleConfig,
    Observation,
    Role,
    Step,
    reconcile,
    scheduling_role,
)
from hetero_operator.controller.plans import PlanBuildError, initial_plan
from hetero_operator.controller.transitions import invalid, status_of, validated
from hetero_operator.controller.validation import job_problems
from hetero_operator.resources import HeteroTrainJobStatus
from hetero_operator.scheduler import Decisions, JobRequest, SchedulerConfig, Snapshot


@dataclass(frozen=True, slots=True)
class CycleConfig:
    lifecycle: LifecycleConfig = field(default_factory=LifecycleConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kueue: KueueConfig | None = None  # None: jobs labelled for Kueue are scheduled like any other
    launch: LaunchOptions = field(default_factory=LaunchOptions)  # its ports and guards judge templates


@dataclass(frozen=True, slots=True)
class InFlight:
    """What this replica has under way: generations being created, finalizers being added (key,
    uid), deleted jobs being cleaned up, jobs with a write on their chain, and jobs whose new Kueue
    Workload the watch does not show yet."""

    creations: frozenset[Generation] = frozenset()
    finalizers: frozenset[tuple[str, str]] = frozenset()
    cleaning: frozenset[str] = frozenset()
    busy: frozenset[str] = frozenset()
    workloads: frozenset[str] = frozenset()
    last_cycle_at: float | None = None  # when the previous cycle ran (None: none since the start)


@dataclass(frozen=True)
class Prepared:
    view: ClusterView
    now: float
    jobs: Mapping[str, JobCycle]
    snapshot: Snapshot
    invalid: tuple[InvalidMark, ...] = ()
    add_finalizer: tuple[JobFacts, ...] = ()
    clean_up: tuple[CleanUp, ...] = ()
    restarts: int = 0
    wake_in: float | None = None


def prepare(view: ClusterView, now: float, in_flight: InFlight, config: CycleConfig) -> Prepared:
    jobs: dict[str, JobCycle] = {}
    marks: list[InvalidMark] = []
    finalizers: list[JobFacts] = []
    clean_up: list[CleanUp] = []
    restarts, wakes = 0, []
    exact: dict[str, Mapping[str, int] | None] = {}
    arrivals = arrival_times(view.jobs.values(), now)
    for key, facts in sorted(view.jobs.items()):
        if facts.deleting:
            if names.FINALIZER in facts.finalizers and key not in in_flight.cleaning:
                workloads = tuple(w.name for w in view.kueue.workloads_of(key, facts.uid))
                clean_up.append(CleanUp(facts, _on_lost_nodes(view, key), workloads))
            continue
        if names.FINALIZER not in facts.finalizers and (key, facts.uid) not in in_flight.finalizers:
            finalizers.append(facts)
        job, problems = job_problems(facts, config.launch)
        if job is None or problems:
            mark = _invalid_mark(facts, problems, now, in_flight)
            marks += [mark] if mark is not None else []
            continue
        checked = validated(job, arrivals.get(key, now))
        seen = job if checked == status_of(job) else job.model_copy(update={"status": checked})
        pods = view.pods_of(key)
        observation = Observation(
            seen, pods, view.lost_nodes(checked.allocation), now, view.job_speeds(seen, checked)
        )
        step = reconcile(observation, config.lifecycle)
        item = JobCycle(facts, status_of(job), seen).with_status(step.status)
        item = item.then(_step_actions(item, step, view, in_flight))
        outcome = _kueue(item, view, now, in_flight, config)
        if outcome is not None:
            item = outcome.item
            if is_submitted(item):
                exact[key] = outcome.exact_mix
            wakes += [outcome.wake_in] if outcome.wake_in is not None else []
        jobs[key] = item
        restarts += step.restarted
        wakes += [step.wake_in] if step.wake_in is not None else []
    requests = _requests(jobs, view, exact, now)
    return Prepared(
        view,
        now,
        jobs,
        build_snapshot(view, requests, now, config.scheduler.charging),
        tuple(marks),
        tuple(finalizers),
        tuple(clean_up),
        restarts,
        min(wakes, default=None),
    )


def finish(prepared: Prepared, decisions: Decisions, config: CycleConfig) -> CyclePlan:
    grace = config.lifecycle.checkpoint_grace_seconds
    effects = apply_decisions(decisions, prepared.jobs, prepared.view, prepared.now, grace)
    writes = [item.write() for item in effects.jobs.values()]
    wakes = [w for w in (prepared.wake_in, effects.wake_in) if w is not None]
    return CyclePlan(
        writes=tuple(w for w in writes if w is not None),
        invalid=prepared.invalid,
        add_finalizer=prepared.add_finalizer,
        clean_up=prepared.clean_up,
        decisions=decisions,
        counts=CycleCounts(
            placements=effects.placements,
            restarts=prepared.restarts,
            preemptions=effects.preemptions,
            first_placement_seconds=effects.first_placement_seconds,
        ),
        phases=phase_counts(effects.jobs),
        wake_in=min(wakes, default=None),
    )


def _kueue(
    item: JobCycle, view: ClusterView, now: float, in_flight: InFlight, config: CycleConfig
) -> KueueOutcome | None:
    """The Kueue step of a job labelled for Kueue; None for any other job (a job whose label was
    taken off gives its Workloads up)."""
    if config.kueue is None:
        return None
    if not is_submitted(item):
        cleanup = unlabelled_cleanup(item, view) if item.key not in in_flight.busy else ()
        return KueueOutcome(item.then(cleanup)) if cleanup else None
    cycle = KueueCycle(
        view,
        now,
        config.kueue,
        config.scheduler,
        config.lifecycle.checkpoint_grace_seconds,
        creating=item.key in in_flight.workloads,
        busy=item.key in in_flight.busy,
        last_cycle_at=in_flight.last_cycle_at,
    )
    return kueue_step(item, cycle)


def _on_lost_nodes(view: ClusterView, key: str) -> tuple[str, ...]:
    """A job's pods on nodes that are gone or not Ready."""
    return tuple(
        p.name for p in view.pods_of(key) if (node := view.nodes.get(p.node or "")) is None or not node.ready
    )


def _invalid_mark(
    facts: JobFacts, problems: list[str], now: float, in_flight: InFlight
) -> InvalidMark | None:
    """Valid=False, unless it is already said or a write for the job is on its way."""
    current = facts.model.status if facts.model is not None else None
    status = invalid(current, problems, now)
    if current is not None and status == current:
        return None
    if current is None and facts.phase is not None:
        return None  # unparsable, and already marked
    if facts.key in in_flight.busy:
        return None  # the next cycle sees what that write did
    return InvalidMark(facts, status, tuple(problems))


def _step_actions(item: JobCycle, step: Step, view: ClusterView, in_flight: InFlight) -> list[Action]:
    """A lifecycle step's actions, in the order they run after the status write."""
    actions: list[Action] = []
    if step.force_delete_pods:
        actions.append(DeletePods(step.force_delete_pods, force=True))
    if step.delete_pods:
        actions.append(DeletePods(step.delete_pods))
    if step.request_checkpoint:
        actions.append(RequestCheckpoint(step.request_checkpoint))
    if step.publish_plan is not None:
        actions.append(PublishPlan(step.publish_plan))
    if step.ensure_generation:
        create = _create_generation(item, step.status, view, in_flight)
        actions += [create] if create is not None else []
    actions += [PostEvent(event) for event in step.events]
    if step.delete_job and item.key not in in_flight.busy:
        actions.append(DeleteJob())
    return actions


def _create_generation(
    item: JobCycle, status: HeteroTrainJobStatus, view: ClusterView, in_flight: InFlight
) -> CreateGeneration | None:
    """Create the current generation's objects unless that is under way already. The plan goes in
    only where the job has none (a restart keeps the plan it was rebalanced to)."""
    allocation = status.allocation
    if allocation is None or not allocation.workers:
        return None
    if (item.key, item.facts.uid, allocation.generation) in in_flight.creations:
        return None
    version = status.plan.version if status.plan is not None else 1
    predicted = status.plan.predicted_iteration_seconds if status.plan is not None else None
    try:
        speeds = view.job_speeds(item.job, status)
        plan: contract.Plan = initial_plan(item.job.spec, allocation, speeds, version, predicted)
    except PlanBuildError:
        return None  # it was built when the job was placed; a later GPUClass edit broke it
    return CreateGeneration(allocation.generation, plan, view.launch_classes())


def _requests(
    jobs: Mapping[str, JobCycle],
    view: ClusterView,
    kueue: Mapping[str, Mapping[str, int] | None],
    now: float,
) -> Iterable[JobRequest]:
    """Queued jobs ask for GPUs; jobs holding GPUs keep them. A job still carrying out an earlier
    decision (draining, or its old workers still stopping) is not moved again meanwhile. A job
    under Kueue asks only once admitted, for exactly the GPUs admitted, and is never moved by the
    scheduler (Kueue preempts it instead)."""
    for key, item in jobs.items():
        status = item.status
        pods = view.pods_of(key)
        role = scheduling_role(item.job, status, pods, now)
        under_kueue = key in kueue
        catalog = view.workload_estimate(item.job)
        if role is Role.QUEUED:
            if not under_kueue:
                yield job_request(item.facts, item.job, status, holding=False, catalog=catalog)
            elif (mix := kueue[key]) is not None:
                yield job_request(item.facts, item.job, status, holding=False, exact_mix=mix, catalog=catalog)
        elif role is Role.HOLDING and not view.lost_nodes(status.allocation):
            generation = status.allocation.generation if status.allocation is not None else None
            stopping = any(p.live and p.generation != generation for p in pods)
            movable = not stopping and not is_true(status, ConditionType.DRAINING) and not under_kueue
            yield job_request(
                item.facts, item.job, status, holding=True, movable=movable, now=now, catalog=catalog
            )
