"""One rebalancing step for one job, as data: what the rebalancer decided so far (`RebalanceState`,
frozen), what it saw of the job at this pass (`Round`), and the step from them to the new state,
the decision to publish and what to look at next (`RebalanceStep`). Pure: no I/O, no event loop,
no clock. The runner gathers the round (the plan, its measurements, the history), calls `step`,
fetches what the step asks for next (the layer costs, the history, the totals a watch starts at)
and publishes the decision.

A round is one of:

- a plan's first round, `everyEpochs` after it began: a split gone back to that measured better
  (converged) is kept and watched; a HetPipe plan's stage cuts follow the layer costs; a round in
  which a worker's speed moved since the last split's is no basis for a split (it straddled a
  change: the watch confirms it on the steps after it); otherwise the last rebalance is checked
  against measurement, or the split decided anew on the history;
- the steps after a straddled round (the watch's confirming window): a change they show too reopens
  the split; if none, the split is judged as usual, with them as its round;
- a confirmed change of speed seen by the watch: the split is decided anew on the newest steps alone.

The watch's looks at a settled split (`Watched`: each rank's totals) step the same way: a look
updates the watch (`watch_step.look`), and the steps after a straddled round, or a confirmed
change, come back as the round to step on next (`Look.ROUND`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from hetero_operator.plan import Plan, Strategy
from hetero_operator.rebalance.decide import BatchPolicy, RebalanceDecision, confirm, decide
from hetero_operator.rebalance.history import History, record
from hetero_operator.rebalance.measurements import JobMeasurements
from hetero_operator.rebalance.settings import RebalancerTuning
from hetero_operator.rebalance.watch import (
    Totals,
    describe,
    moved_between_splits,
    per_sample_seconds,
    same_split_before,
)
from hetero_operator.rebalance.watch_step import Found, WatchState, look, straddle


@dataclass(frozen=True)
class RebalanceState:
    """What the job's rebalancer decided so far (the measurements and plans it read are cached
    beside it, in `JobMemory`)."""

    last_decided_version: int = 0
    converged: bool = False  # the last rebalance did not pay off as measured: keep the split
    # Plan versions below this were measured before a worker changed speed: no model is fitted to them.
    history_from: int = 0
    watch: WatchState = field(default_factory=WatchState)


class Origin(Enum):
    """Where a round's steps come from."""

    FIRST = "first"  # a plan's first round, `everyEpochs` after it began
    AFTER_STRADDLE = "after-straddle"  # the steps after a round that straddled a change of speed
    CHANGED = "changed"  # the watch confirmed a change of speed (`Round.changed`)


@dataclass(frozen=True)
class Round:
    """What the runner saw of the job for one round: the plan the workers run and its measurements,
    the plans and measurements read so far (this round's among them), what the spec allows, and
    what the step may have asked for (None: not looked at yet)."""

    origin: Origin
    plan: Plan
    measured: JobMeasurements
    epoch: int | None
    policy: BatchPolicy
    plans: Mapping[int, Plan] = field(default_factory=dict)
    measurements: Mapping[int, JobMeasurements] = field(default_factory=dict)
    changed: Mapping[int, float] = field(default_factory=dict)
    history: History | None = None
    stage_cuts: RebalanceDecision | None = None


@dataclass(frozen=True)
class Watched:
    """One look at a settled split: the plan the workers run, the epoch, each rank's totals now, and
    what a round on the window since the last look would need (as in `Round`)."""

    plan: Plan
    epoch: int | None
    totals: Totals
    policy: BatchPolicy
    plans: Mapping[int, Plan] = field(default_factory=dict)
    measurements: Mapping[int, JobMeasurements] = field(default_factory=dict)


class Look(Enum):
    """What the step needs looked at before it can decide."""

    NOTHING = "nothing"
    ROUND = "round"  # the watch found a round to decide on (`RebalanceStep.round`): step on it
    HISTORY = "history"  # the samples of every plan version measured since `history_from`
    STAGE_CUTS = "stage-cuts"  # the layer costs, recut into a HetPipe decision


@dataclass(frozen=True)
class RebalanceStep:
    """The new state; the decision to publish (None: nothing to publish); `watch`: each rank's
    compute per sample to watch the plan against from here (None: no new watch starts, else the
    runner reads the totals its window starts at); what to look at before stepping again with it;
    and a line for the log."""

    state: RebalanceState
    decision: RebalanceDecision | None = None
    watch: Mapping[int, float] | None = None
    look: Look = Look.NOTHING
    note: str | None = None
    round: Round | None = None  # the round the watch found (`Look.ROUND`)


def step(state: RebalanceState, seen: Round | Watched, tuning: RebalancerTuning) -> RebalanceStep:
    """One step of one job, on a round or a look of the watch: the new state, the decision, and
    what to look at next."""
    if isinstance(seen, Watched):
        return _watched(state, seen, tuning)
    if seen.origin is Origin.CHANGED:
        return _reopen(state, seen, seen.changed)
    if seen.origin is Origin.AFTER_STRADDLE:
        if moved := _moved(seen):
            return _reopen(state, seen, moved)
        if seen.history is None:
            return RebalanceStep(state, look=Look.HISTORY)
        return _conclude(*_decide(state, seen, seen.history), seen)
    plan, measured = seen.plan, seen.measured
    if seen.history is None:
        return RebalanceStep(state, look=Look.HISTORY)
    if state.converged:  # the split went back to one that measured better: keep it, and watch it
        # Watched against its speeds when it last ran: it may have measured worse than this split
        # because a worker's speed changed in between (a round that may straddle that change is no
        # baseline; the watch's own windows judge it).
        earlier = same_split_before(seen.plans, seen.measurements, plan)
        baseline = (
            per_sample_seconds(earlier[1], earlier[0]) if earlier else per_sample_seconds(measured, plan)
        )
        return RebalanceStep(replace(state, last_decided_version=plan.version), watch=baseline)
    if plan.strategy is Strategy.HETPIPE:
        if seen.stage_cuts is None:
            return RebalanceStep(state, look=Look.STAGE_CUTS)
        return _conclude(state, seen.stage_cuts, seen)
    if moved := _moved(seen):
        # A worker's speed moved since the last round, maybe inside this one: no split is decided on
        # it; the watch waits for the steps after this look and decides on them alone.
        watch = straddle(state.watch, plan, measured, tuning)
        return RebalanceStep(
            replace(state, last_decided_version=plan.version, watch=watch),
            watch=per_sample_seconds(measured, plan),
            note=f"{describe(moved)}; judged on the steps after this round",
        )
    return _conclude(*_decide(state, seen, seen.history), seen)


def _watched(state: RebalanceState, seen: Watched, tuning: RebalancerTuning) -> RebalanceStep:
    """One look of the watch (`watch_step.look`); the steps after a straddled round, or a confirmed
    change, are a round to step on next (its window measures the split as it runs now)."""
    looked = look(state.watch, seen.plan, seen.epoch, seen.totals, tuning)
    state = replace(state, watch=looked.state)
    recent = looked.window
    if looked.found is Found.SUSPECT:
        return RebalanceStep(state, note=f"maybe {describe(looked.changed)} ({looked.steps} steps)")
    if looked.found is Found.MOVED_WITHIN:
        # The change began inside the confirming window: confirm it on the steps after it.
        return RebalanceStep(state, note=f"{describe(looked.changed)} inside the confirming window")
    if looked.found in (Found.STRADDLED, Found.CHANGED) and recent is not None:
        origin = Origin.AFTER_STRADDLE if looked.found is Found.STRADDLED else Origin.CHANGED
        measurements = {**seen.measurements, seen.plan.version: recent}
        found = Round(
            origin, seen.plan, recent, seen.epoch, seen.policy, seen.plans, measurements, looked.changed
        )
        return RebalanceStep(state, look=Look.ROUND, round=found)
    return RebalanceStep(state)


def _previous(seen: Round) -> tuple[Plan, JobMeasurements] | None:
    previous = seen.plans.get(seen.plan.version - 1)
    previous_measured = seen.measurements.get(seen.plan.version - 1)
    return None if previous is None or previous_measured is None else (previous, previous_measured)


def _moved(seen: Round) -> dict[int, float]:
    """Ranks whose speed moved between the last split's round and this one's (fixed splits only: an
    adaptive batch's rounds are compared by the policy itself)."""
    previous = _previous(seen)
    if previous is None or seen.policy.adaptive:
        return {}
    return moved_between_splits(previous[0], previous[1], seen.plan, seen.measured)


def _decide(state: RebalanceState, seen: Round, history: History) -> tuple[RebalanceState, RebalanceDecision]:
    """The last rebalance checked against measurement, else the split decided on the history."""
    apply_at = (seen.measured.epoch or 0) + 1
    previous = _previous(seen)
    if previous is not None and not seen.policy.adaptive:
        verdict = confirm(
            seen.plan, seen.measured, previous[0], previous[1], seen.policy.min_improvement, apply_at
        )
        state = replace(state, converged=verdict is not None)
        if verdict is not None:
            return state, verdict
    return state, decide(seen.plan, history, seen.policy, seen.measured, apply_at)


def _conclude(state: RebalanceState, decision: RebalanceDecision, seen: Round) -> RebalanceStep:
    """Decided on this plan; a split that stays is watched from here."""
    state = replace(state, last_decided_version=seen.plan.version)
    watch = per_sample_seconds(seen.measured, seen.plan) if decision.plan is None else None
    return RebalanceStep(state, decision, watch)


def _reopen(state: RebalanceState, seen: Round, changed: Mapping[int, float]) -> RebalanceStep:
    """A settled split whose workers changed speed: decide again, on the newest round alone (and a
    new split is confirmed against the split as it runs now)."""
    plan, recent = seen.plan, seen.measured
    decision = decide(plan, record({}, recent, plan), seen.policy, recent, (seen.epoch or 0) + 1)
    decision = replace(decision, reason=f"{describe(changed)}; {decision.reason}")
    baselines = {**state.watch.baselines, plan.version: per_sample_seconds(recent, plan)}
    state = replace(
        state,
        converged=False,
        history_from=plan.version,
        last_decided_version=plan.version if decision.plan is not None else state.last_decided_version,
        watch=replace(state.watch, baselines=baselines),  # one change reopens it once
    )
    return RebalanceStep(state, decision, note=describe(changed))
