"""The rebalancer's state machine as data, table by table: one look of the watch over a settled split
(`watch_step.look`: watch, suspect, confirm, straddle), and one step of a round (`step.step`: a
plan's first round, the steps after a straddled round, a confirmed change). Every case gives the
state before, what was seen, and the state and finding expected after, written out by hand."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from hetero_operator.plan import HetPipeParams, Plan, Strategy
from hetero_operator.rebalance.decide import BatchPolicy, RebalanceDecision
from hetero_operator.rebalance.measurements import JobMeasurements, WorkerMeasurement
from hetero_operator.rebalance.settings import RebalancerTuning
from hetero_operator.rebalance.step import Look, Origin, RebalanceState, Round, Watched, step
from hetero_operator.rebalance.watch import RankTotals, Totals
from hetero_operator.rebalance.watch_step import Confirming, Found, WatchState, look, start, straddle

TUNING = RebalancerTuning(min_steps=3, min_confirming_steps=10)
V = 2  # the plan version watched
PLAN = Plan(version=V, world_size=2, global_batch=20, local_batches=[10, 10])


def totals(*ranks: tuple[float, float]) -> Totals:
    """Each rank's cumulative totals from (steps, compute seconds summed over them); sync-start is
    0.8 of compute, the step 0.2 s, the rest communication."""
    return {
        rank: RankTotals((compute, 0.8 * compute, 0.2 * steps - compute, 0.2 * steps), (steps,) * 4)
        for rank, (steps, compute) in enumerate(ranks)
    }


# At the last look: 100 steps of each rank at 0.1 s of compute (0.01 s per sample of 10).
T0 = totals((100, 10.0), (100, 10.0))
BASELINE = {0: 0.01, 1: 0.01}
WATCHED = WatchState(totals={V: T0}, watched_epoch=4, baselines={V: BASELINE})


@dataclass(frozen=True)
class LookCase:
    name: str
    before: WatchState
    seen: Totals
    found: Found
    after: WatchState
    changed: dict[int, float] = field(default_factory=dict)
    steps: int = 0  # the fewest steps of a rank in the window
    epoch: int | None = 5


MID = totals((110, 11.0), (110, 11.0))  # ten steps into a confirming window, speeds as before
LOOKS = [
    LookCase(
        "the first look starts the window",
        WatchState(baselines={V: BASELINE}),
        T0,
        Found.NOTHING,
        WatchState(totals={V: T0}, watched_epoch=5, baselines={V: BASELINE}),
    ),
    LookCase(
        "too few steps since the last look: the window restarts from this look",
        WATCHED,
        totals((102, 10.2), (102, 10.2)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((102, 10.2), (102, 10.2))}, watched_epoch=5),
        steps=2,
    ),
    LookCase(
        "an epoch at the speeds it was decided with: keep watching",
        WATCHED,
        totals((140, 14.0), (140, 14.0)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((140, 14.0), (140, 14.0))}, watched_epoch=5),
        steps=40,
    ),
    LookCase(
        "a rank 5% slower is noise, under half the threshold",
        WATCHED,
        totals((140, 14.0), (140, 14.2)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((140, 14.0), (140, 14.2))}, watched_epoch=5),
        steps=40,
    ),
    LookCase(
        "a rank 15% slower at an epoch's end is suspect: confirmed on half an epoch's steps",
        WATCHED,
        totals((140, 14.0), (140, 14.6)),
        Found.SUSPECT,
        replace(
            WATCHED,
            totals={V: totals((140, 14.0), (140, 14.6))},
            watched_epoch=5,
            suspected={V: Confirming(20)},
        ),
        changed={1: 0.1 / 0.115},
        steps=40,
    ),
    LookCase(
        "a suspect change in a short epoch waits for at least min_confirming_steps",
        WATCHED,
        totals((112, 11.2), (112, 11.5)),
        Found.SUSPECT,
        replace(
            WATCHED,
            totals={V: totals((112, 11.2), (112, 11.5))},
            watched_epoch=5,
            suspected={V: Confirming(10)},
        ),
        changed={1: 0.1 / 0.125},
        steps=12,
    ),
    LookCase(
        "the confirming window short of its steps goes on from the same look",
        replace(WATCHED, suspected={V: Confirming(20)}),
        MID,
        Found.CONFIRMING,
        replace(WATCHED, suspected={V: Confirming(20, (MID,))}),
    ),
    LookCase(
        "a rank with no step since the last look: the confirming window goes on",
        replace(WATCHED, suspected={V: Confirming(20)}),
        totals((130, 13.0), (100, 10.0)),
        Found.CONFIRMING,
        replace(WATCHED, suspected={V: Confirming(20, (totals((130, 13.0), (100, 10.0)),))}),
    ),
    LookCase(
        "a rank with no step since the last look, nothing suspected: no window",
        WATCHED,
        totals((130, 13.0), (100, 10.0)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((130, 13.0), (100, 10.0))}, watched_epoch=5),
    ),
    LookCase(
        "a suspect change that holds at the full threshold reopens the split",
        replace(WATCHED, suspected={V: Confirming(20)}),
        totals((120, 12.0), (120, 13.0)),
        Found.CHANGED,
        replace(WATCHED, totals={V: totals((120, 12.0), (120, 13.0))}, watched_epoch=5),
        changed={1: 0.1 / 0.15},
        steps=20,
    ),
    LookCase(
        "a suspect change that does not hold: back to watching",
        replace(WATCHED, suspected={V: Confirming(20)}),
        totals((120, 12.0), (120, 12.2)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((120, 12.0), (120, 12.2))}, watched_epoch=5),
        steps=20,
    ),
    LookCase(
        "a change that began inside the confirming window: confirmed again on the steps after it",
        replace(WATCHED, suspected={V: Confirming(20, (MID,))}),
        totals((120, 12.0), (120, 13.0)),  # rank 1: ten steps at 0.1 s, then ten at 0.2 s
        Found.MOVED_WITHIN,
        replace(
            WATCHED,
            totals={V: totals((120, 12.0), (120, 13.0))},
            watched_epoch=5,
            suspected={V: Confirming(20)},
        ),
        changed={1: 0.5},
        steps=20,
    ),
    LookCase(
        "the steps after a straddled round, speeds unchanged: the split is judged on them",
        replace(WATCHED, suspected={V: Confirming(10)}, straddled=frozenset({V})),
        totals((110, 11.0), (110, 11.0)),
        Found.STRADDLED,
        replace(WATCHED, totals={V: totals((110, 11.0), (110, 11.0))}, watched_epoch=5),
        steps=10,
    ),
    LookCase(
        "the steps after a straddled round, a rank slower: still judged as a round, not reopened",
        replace(WATCHED, suspected={V: Confirming(10)}, straddled=frozenset({V})),
        totals((110, 11.0), (110, 12.0)),
        Found.STRADDLED,
        replace(WATCHED, totals={V: totals((110, 11.0), (110, 12.0))}, watched_epoch=5),
        steps=10,
    ),
    LookCase(
        "no epoch in the snapshot: the epoch of the last look is kept",
        WATCHED,
        totals((140, 14.0), (140, 14.0)),
        Found.NOTHING,
        replace(WATCHED, totals={V: totals((140, 14.0), (140, 14.0))}),
        steps=40,
        epoch=None,
    ),
]


@pytest.mark.parametrize("case", LOOKS, ids=[c.name for c in LOOKS])
def test_one_look_of_the_watch(case: LookCase) -> None:
    looked = look(case.before, PLAN, case.epoch, case.seen, TUNING)
    assert looked.found is case.found
    assert looked.state == case.after
    assert dict(looked.changed) == pytest.approx(case.changed)
    assert looked.steps == case.steps


def test_a_watch_starts_at_the_totals_read_or_at_the_next_look() -> None:
    started = start(WatchState(), V, BASELINE, 3, T0)
    assert started == WatchState(totals={V: T0}, watched_epoch=3, baselines={V: BASELINE})
    assert start(started, V, {0: 0.02}, None, None) == WatchState(watched_epoch=-1, baselines={V: {0: 0.02}})


def test_a_straddled_round_waits_for_half_its_steps_and_at_least_min_confirming_steps() -> None:
    assert straddle(WatchState(), PLAN, measured(V, 5, [0.1, 0.1], steps=60), TUNING) == WatchState(
        suspected={V: Confirming(30)}, straddled=frozenset({V})
    )
    assert straddle(WatchState(), PLAN, measured(V, 5, [0.1, 0.1], steps=12), TUNING) == WatchState(
        suspected={V: Confirming(10)}, straddled=frozenset({V})
    )


# Rounds.

FIXED = BatchPolicy(
    base_global_batch=20,
    minimum=20,
    maximum=20,
    adaptive=False,
    min_improvement=0.05,
    per_worker_max=(None, None),
)
ADAPTIVE = replace(FIXED, minimum=10, maximum=40, adaptive=True)
PREVIOUS = Plan(version=V - 1, world_size=2, global_batch=20, local_batches=[10, 10])
OLDER = Plan(version=V - 2, world_size=2, global_batch=20, local_batches=[10, 10])
SKEWED = Plan(version=V, world_size=2, global_batch=20, local_batches=[12, 8])
PIPELINE = Plan(
    version=V,
    strategy=Strategy.HETPIPE,
    world_size=2,
    global_batch=32,
    local_batches=[32, 0],
    hetpipe=HetPipeParams(
        virtual_workers=[[0, 1]], stage_boundaries=[[2]], microbatches_in_flight=2, staleness_bound=0
    ),
)
CUTS = RebalanceDecision(None, "stage cuts within 5%", "stage-cuts", 0.2)


def measured(version: int, epoch: int | None, computes: list[float], steps: int = 20) -> JobMeasurements:
    step_seconds = max(computes) + 0.001
    workers = tuple(
        WorkerMeasurement(rank, steps, c, 0.8 * c, step_seconds - c, step_seconds)
        for rank, c in enumerate(computes)
    )
    return JobMeasurements(plan_version=version, epoch=epoch, workers=workers)


@dataclass(frozen=True)
class RoundCase:
    name: str
    before: RebalanceState
    seen: Round
    look: Look
    after: RebalanceState
    watch: dict[int, float] | None = None  # the baseline a new watch starts from
    publishes: bool = False  # a decision to publish
    new_plan: bool = False  # ... and it names a new plan
    reason_starts: str = ""
    note: str | None = None


def first(plan: Plan, computes: list[float], **kwargs: object) -> Round:
    """A plan's first round at epoch 5, the previous plan's round at the same speeds."""
    round_ = Round(
        Origin.FIRST,
        plan,
        measured(plan.version, 5, computes),
        5,
        FIXED,
        plans={V - 1: PREVIOUS, plan.version: plan},
        measurements={
            V - 1: measured(V - 1, 3, [0.1, 0.1]),
            plan.version: measured(plan.version, 5, computes),
        },
        history={},
    )
    return replace(round_, **kwargs)  # type: ignore[arg-type]


FRESH = RebalanceState(last_decided_version=V - 1, watch=WatchState(baselines={V - 1: BASELINE}))
DECIDED = replace(FRESH, last_decided_version=V)
STRADDLED = replace(
    FRESH, last_decided_version=V, watch=straddle(WatchState(), PLAN, measured(V, 5, [0.1, 0.2]), TUNING)
)
ROUNDS = [
    RoundCase(
        "a first round without its history: look at the history first",
        FRESH,
        first(PLAN, [0.1, 0.1], history=None),
        Look.HISTORY,
        FRESH,
    ),
    RoundCase(
        "converged, no earlier round of this split: keep it and watch it against this round",
        replace(FRESH, converged=True),
        first(PLAN, [0.1, 0.12], plans={V: PLAN}, measurements={V: measured(V, 5, [0.1, 0.12])}),
        Look.NOTHING,
        replace(FRESH, converged=True, last_decided_version=V),
        watch={0: 0.01, 1: 0.012},
    ),
    RoundCase(
        "converged back to a split measured before: watched against its speeds back then",
        replace(FRESH, converged=True),
        first(
            PLAN,
            [0.1, 0.12],
            plans={V - 2: OLDER, V - 1: SKEWED.model_copy(update={"version": V - 1}), V: PLAN},
            measurements={V - 2: measured(V - 2, 1, [0.09, 0.11]), V - 1: measured(V - 1, 3, [0.12, 0.08])},
        ),
        Look.NOTHING,
        replace(FRESH, converged=True, last_decided_version=V),
        watch={0: 0.009, 1: 0.011},
    ),
    RoundCase(
        "a HetPipe round: look at the layer costs for its stage cuts",
        FRESH,
        first(PIPELINE, [0.1, 0.1], plans={V: PIPELINE}, measurements={}),
        Look.STAGE_CUTS,
        FRESH,
    ),
    RoundCase(
        "a HetPipe round whose cuts stay: published, and the split watched",
        FRESH,
        first(PIPELINE, [0.1, 0.1], plans={V: PIPELINE}, measurements={}, stage_cuts=CUTS),
        Look.NOTHING,
        DECIDED,
        watch={0: 0.1 / 32},
        publishes=True,
        reason_starts="stage cuts within 5%",
    ),
    RoundCase(
        "a round in which a rank moved since the last split's: it straddled the change, no split decided",
        FRESH,
        first(PLAN, [0.1, 0.2]),
        Look.NOTHING,
        replace(
            FRESH,
            last_decided_version=V,
            watch=replace(FRESH.watch, suspected={V: Confirming(10)}, straddled=frozenset({V})),
        ),
        watch={0: 0.01, 1: 0.02},
        note="worker speeds changed: rank 1 at 0.5x its speed; judged on the steps after this round",
    ),
    RoundCase(
        "an adaptive batch's round never straddles a change: nothing to fit, the split stays, watched",
        FRESH,
        first(PLAN, [0.1, 0.2], policy=ADAPTIVE),
        Look.NOTHING,
        DECIDED,
        watch={0: 0.01, 1: 0.02},
        publishes=True,
    ),
    RoundCase(
        "a new split that measured slower than the last: confirmed against it, converged",
        FRESH,
        first(SKEWED, [0.12, 0.08]),
        Look.NOTHING,
        replace(DECIDED, converged=True),
        publishes=True,
        new_plan=True,
    ),
    RoundCase(
        "the steps after a straddled round show the rank moved too: the split reopens on them",
        STRADDLED,
        first(PLAN, [0.1, 0.2], origin=Origin.AFTER_STRADDLE, history=None),
        Look.NOTHING,
        replace(
            STRADDLED,
            history_from=V,
            watch=replace(STRADDLED.watch, baselines={**STRADDLED.watch.baselines, V: {0: 0.01, 1: 0.02}}),
        ),
        publishes=True,
        new_plan=True,
        reason_starts="worker speeds changed: rank 1 at 0.5x its speed; ",
        note="worker speeds changed: rank 1 at 0.5x its speed",
    ),
    RoundCase(
        "the steps after a straddled round show no move: look at the history to judge them",
        STRADDLED,
        first(PLAN, [0.1, 0.1], origin=Origin.AFTER_STRADDLE, history=None),
        Look.HISTORY,
        STRADDLED,
    ),
    RoundCase(
        "... then judged as the split's round: it stays, and is watched against them",
        STRADDLED,
        first(PLAN, [0.1, 0.1], origin=Origin.AFTER_STRADDLE),
        Look.NOTHING,
        replace(STRADDLED, converged=True),
        watch={0: 0.01, 1: 0.01},
        publishes=True,
    ),
    RoundCase(
        "a change the watch confirmed: decided anew on the newest steps alone, once",
        replace(DECIDED, converged=True, history_from=1),
        first(PLAN, [0.1, 0.2], origin=Origin.CHANGED, changed={1: 0.5}, history=None),
        Look.NOTHING,
        replace(
            DECIDED, history_from=V, watch=WatchState(baselines={V - 1: BASELINE, V: {0: 0.01, 1: 0.02}})
        ),
        publishes=True,
        new_plan=True,
        reason_starts="worker speeds changed: rank 1 at 0.5x its speed; ",
        note="worker speeds changed: rank 1 at 0.5x its speed",
    ),
]


@pytest.mark.parametrize("case", ROUNDS, ids=[c.name for c in ROUNDS])
def test_one_step_of_a_round(case: RoundCase) -> None:
    taken = step(case.before, case.seen, TUNING)
    assert taken.look is case.look
    assert taken.state == case.after
    assert (dict(taken.watch) if taken.watch is not None else None) == (
        pytest.approx(case.watch) if case.watch is not None else None
    )
    assert (taken.decision is not None) == case.publishes
    assert (taken.decision is not None and taken.decision.plan is not None) == case.new_plan
    if case.reason_starts:
        assert taken.decision is not None and taken.decision.reason.startswith(case.reason_starts)
    assert taken.note == case.note


def test_a_step_never_changes_the_state_it_was_given() -> None:
    before = replace(STRADDLED, converged=True)
    kept = replace(before)
    step(before, first(PLAN, [0.1, 0.2], origin=Origin.CHANGED, changed={1: 0.5}), TUNING)
    step(before, first(PLAN, [0.1, 0.2]), TUNING)
    assert before == kept


# Looks of the watch, stepped: the watch's state moves on, and a window to decide on comes back as
# the round to step on next.


@dataclass(frozen=True)
class WatchedCase:
    name: str
    before: WatchState
    seen: Totals
    after: WatchState
    look: Look = Look.NOTHING
    note: str | None = None
    origin: Origin | None = None  # of the round found
    window_steps: int = 0
    changed: dict[int, float] = field(default_factory=dict)


WATCHED_LOOKS = [
    WatchedCase(
        "an epoch unchanged: nothing to say",
        WATCHED,
        totals((140, 14.0), (140, 14.0)),
        replace(WATCHED, totals={V: totals((140, 14.0), (140, 14.0))}, watched_epoch=5),
    ),
    WatchedCase(
        "a suspect change is logged with its steps",
        WATCHED,
        totals((140, 14.0), (140, 14.6)),
        replace(
            WATCHED,
            totals={V: totals((140, 14.0), (140, 14.6))},
            watched_epoch=5,
            suspected={V: Confirming(20)},
        ),
        note="maybe worker speeds changed: rank 1 at 0.87x its speed (40 steps)",
    ),
    WatchedCase(
        "a change that began inside the confirming window is logged as such",
        replace(WATCHED, suspected={V: Confirming(20, (MID,))}),
        totals((120, 12.0), (120, 13.0)),
        replace(
            WATCHED,
            totals={V: totals((120, 12.0), (120, 13.0))},
            watched_epoch=5,
            suspected={V: Confirming(20)},
        ),
        note="worker speeds changed: rank 1 at 0.5x its speed inside the confirming window",
    ),
    WatchedCase(
        "a confirmed change: its window is the round to decide on",
        replace(WATCHED, suspected={V: Confirming(20)}),
        totals((120, 12.0), (120, 13.0)),
        replace(WATCHED, totals={V: totals((120, 12.0), (120, 13.0))}, watched_epoch=5),
        look=Look.ROUND,
        origin=Origin.CHANGED,
        window_steps=20,
        changed={1: 0.1 / 0.15},
    ),
    WatchedCase(
        "the steps after a straddled round: the round to judge the split on",
        replace(WATCHED, suspected={V: Confirming(10)}, straddled=frozenset({V})),
        totals((110, 11.0), (110, 11.0)),
        replace(WATCHED, totals={V: totals((110, 11.0), (110, 11.0))}, watched_epoch=5),
        look=Look.ROUND,
        origin=Origin.AFTER_STRADDLE,
        window_steps=10,
    ),
]


@pytest.mark.parametrize("case", WATCHED_LOOKS, ids=[c.name for c in WATCHED_LOOKS])
def test_one_step_of_the_watch(case: WatchedCase) -> None:
    before = replace(DECIDED, watch=case.before)
    seen = Watched(PLAN, 5, case.seen, FIXED, plans={V: PLAN}, measurements={V: measured(V, 3, [0.1, 0.1])})
    taken = step(before, seen, TUNING)
    assert taken.state == replace(DECIDED, watch=case.after)
    assert taken.look is case.look
    assert taken.note == case.note
    assert (taken.decision, taken.watch) == (None, None)
    if case.origin is None:
        assert taken.round is None
        return
    found = taken.round
    assert found is not None and found.origin is case.origin
    assert (found.plan, found.epoch, found.policy, found.history) == (PLAN, 5, FIXED, None)
    assert [w.steps for w in found.measured.workers] == [case.window_steps] * 2
    assert found.measurements[V] == found.measured  # a new split is confirmed against the window
    assert dict(found.changed) == pytest.approx(case.changed)
