"""The watch over a settled split, as data: what the rebalancer remembers of it (`WatchState`,
frozen), and one pure step from that memory and one look at the workers' totals to the new memory
and what the look found (`WatchStep`). The runner fetches the totals, calls `look`, stores the new
state and carries out the finding; nothing here does I/O or reads a clock.

The state machine, for one plan version:

- watching: every `everyEpochs` the window since the last look is compared with the baseline (the
  compute per sample the split was decided with); a change of half the threshold makes it suspect.
- confirming (a suspect change, or a round that straddled one): every pass looks, and the window
  goes on from the same look until it has the steps it needs; a change that began inside it restarts
  it; otherwise it decides: a straddled round is judged anew on it, a suspect change that holds at
  the full threshold reopens the split, one that does not goes back to watching."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum

from hetero_operator.plan import Plan
from hetero_operator.rebalance.measurements import JobMeasurements
from hetero_operator.rebalance.settings import RebalancerTuning
from hetero_operator.rebalance.watch import (
    SUSPECT_CHANGE,
    Totals,
    changed_speeds,
    confirming_steps,
    moved_within,
    per_sample_seconds,
    window,
)


@dataclass(frozen=True)
class Confirming:
    """The window that confirms a suspected change: the steps it needs, and the totals at the looks
    part-way through it (a change that began inside it shows as two parts at different speeds)."""

    steps: int
    looks: tuple[Totals, ...] = ()


@dataclass(frozen=True)
class WatchState:
    """The watch's memory, by plan version: each rank's totals at the last look, the compute per
    sample the split was decided (or last re-judged) with, a change waiting to be confirmed, and the
    versions whose round straddled a change; and the epoch of the last look."""

    totals: Mapping[int, Totals] = field(default_factory=dict)
    watched_epoch: int = -1
    baselines: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    # A change seen in one window only: it may have begun inside it, so the next window decides.
    suspected: Mapping[int, Confirming] = field(default_factory=dict)
    # Versions whose round showed a worker's speed moved since the round before: the change may have
    # begun inside the round, so the steps after it are waited for and the split decided on them.
    straddled: frozenset[int] = frozenset()


class Found(Enum):
    """What one look at the totals found."""

    NOTHING = "nothing"  # no window yet, too few steps, or no change: keep watching
    CONFIRMING = "confirming"  # the confirming window has too few steps yet: it goes on
    SUSPECT = "suspect"  # a change seen in this window: confirm it on the steps after it
    MOVED_WITHIN = "moved-within"  # the change began inside the confirming window: confirm again
    STRADDLED = "straddled"  # the steps after a straddled round: judge the split on them
    CHANGED = "changed"  # a confirmed change of speed: decide the split anew on `window`


@dataclass(frozen=True)
class WatchStep:
    """The new state, what was found, the window it was found in, and the ranks whose speed changed
    (rank -> new speed ÷ old: suspect, moved within the window, or changed)."""

    state: WatchState
    found: Found
    window: JobMeasurements | None = None
    changed: Mapping[int, float] = field(default_factory=dict)

    @property
    def steps(self) -> int:
        """The fewest steps any rank ran in the window (0 without one)."""
        return min(w.steps for w in self.window.workers) if self.window is not None else 0


def _without(mapping: Mapping[int, Confirming], key: int) -> dict[int, Confirming]:
    return {k: v for k, v in mapping.items() if k != key}


def look(
    state: WatchState, plan: Plan, epoch: int | None, totals: Totals, tuning: RebalancerTuning
) -> WatchStep:
    """One look at a settled split, over the window since the last look (`totals`: each rank's totals
    now): a worker whose speed changed in that window and again in the steps after it (the first
    window may have begun before the change) reopens the decision, judged on the second window alone."""
    version = plan.version
    before = state.totals.get(version)
    recent = window(before, totals, version, epoch) if before is not None else None
    confirming = state.suspected.get(version)
    steps = min(w.steps for w in recent.workers) if recent is not None else 0
    if confirming is not None and steps < confirming.steps:
        going_on = Confirming(confirming.steps, (*confirming.looks, totals))
        return WatchStep(replace(state, suspected={**state.suspected, version: going_on}), Found.CONFIRMING)
    state = replace(
        state,
        totals={**state.totals, version: totals},
        watched_epoch=epoch if epoch is not None else state.watched_epoch,
    )
    if recent is None or steps < tuning.min_steps:
        return WatchStep(state, Found.NOTHING, recent)
    speeds = per_sample_seconds(recent, plan)
    baseline = state.baselines.get(version, {})
    if confirming is None:
        if suspect := changed_speeds(baseline, speeds, SUSPECT_CHANGE):
            needed = Confirming(confirming_steps(recent, tuning.min_confirming_steps))
            return WatchStep(
                replace(state, suspected={**state.suspected, version: needed}), Found.SUSPECT, recent, suspect
            )
        return WatchStep(state, Found.NOTHING, recent)
    assert before is not None  # a window was measured
    if moved := moved_within(before, confirming.looks, totals, plan, tuning.min_steps):
        again = Confirming(confirming.steps)
        return WatchStep(
            replace(state, suspected={**state.suspected, version: again}), Found.MOVED_WITHIN, recent, moved
        )
    state = replace(state, suspected=_without(state.suspected, version))
    if version in state.straddled:
        return WatchStep(replace(state, straddled=state.straddled - {version}), Found.STRADDLED, recent)
    changed = changed_speeds(baseline, speeds)
    return WatchStep(state, Found.CHANGED if changed else Found.NOTHING, recent, changed)


def start(
    state: WatchState, version: int, baseline: Mapping[int, float], epoch: int | None, totals: Totals | None
) -> WatchState:
    """Watch plan `version` from here, against `baseline` (each rank's compute per sample); its window
    starts at `totals` (None: they could not be read, and the next look starts the window)."""
    kept = {k: v for k, v in state.totals.items() if k != version}
    return replace(
        state,
        baselines={**state.baselines, version: dict(baseline)},
        watched_epoch=epoch if epoch is not None else -1,
        totals=kept if totals is None else {**kept, version: totals},
    )


def straddle(
    state: WatchState, plan: Plan, measured: JobMeasurements, tuning: RebalancerTuning
) -> WatchState:
    """A round in which a worker's speed moved (maybe inside it): no split is decided on it; the steps
    after it, as many as confirm a change, decide it alone."""
    needed = Confirming(confirming_steps(measured, tuning.min_confirming_steps))
    return replace(
        state,
        straddled=state.straddled | {plan.version},
        suspected={**state.suspected, plan.version: needed},
    )
