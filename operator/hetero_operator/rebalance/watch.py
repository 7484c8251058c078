"""After a split has settled, the rebalancer keeps watching: every epoch it compares each worker's
compute per sample over the last epoch with what it was when the split was decided, and a worker
that became clearly slower or faster (a noisy neighbour, throttling, a recovery) in that epoch and
again in the steps right after it reopens the decision with the new speeds. Pure: totals in,
windows and changes out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_operator.plan import Plan
from hetero_operator.rebalance.measurements import JobMeasurements, WorkerMeasurement

# A worker's compute per sample that moved by more than this share over a whole epoch has changed
# speed; step-to-step noise averages out over an epoch's steps and stays well below it.
SPEED_CHANGE = 0.2
# A window in which a change began shows only part of it: half the change makes a rank suspect, and
# the steps after the window confirm it (or not) at the full threshold.
SUSPECT_CHANGE = SPEED_CHANGE / 2
PARTS = ("compute", "sync_start", "comm", "step")
SPEED_CHANGED = "worker speeds changed"  # how a decision reopened by a change of speed begins


@dataclass(frozen=True)
class RankTotals:
    """One rank's cumulative step histograms under one plan: seconds summed and steps counted, per part
    of the step (PARTS order)."""

    seconds: tuple[float, float, float, float]
    steps: tuple[float, float, float, float]


Totals = Mapping[int, RankTotals]


def window(before: Totals, after: Totals, plan_version: int, epoch: int | None) -> JobMeasurements | None:
    """Each rank's mean step between two looks at the totals; None when a rank has no new step."""
    workers = []
    for rank in sorted(after):
        if rank not in before:
            return None
        seconds = [a - b for a, b in zip(after[rank].seconds, before[rank].seconds, strict=True)]
        steps = [a - b for a, b in zip(after[rank].steps, before[rank].steps, strict=True)]
        if min(steps) < 1:
            return None
        means = [s / n for s, n in zip(seconds, steps, strict=True)]
        workers.append(WorkerMeasurement(rank, int(steps[3]), *means))
    return (
        JobMeasurements(plan_version=plan_version, epoch=epoch, workers=tuple(workers)) if workers else None
    )


def per_sample_seconds(measured: JobMeasurements, plan: Plan) -> dict[int, float]:
    """Each rank's compute seconds per sample of its local batch (ranks with no samples left out)."""
    return {
        w.rank: w.compute_seconds / plan.local_batches[w.rank]
        for w in measured.workers
        if w.rank < len(plan.local_batches) and plan.local_batches[w.rank] > 0
    }


def changed_speeds(
    baseline: Mapping[int, float], recent: Mapping[int, float], threshold: float = SPEED_CHANGE
) -> dict[int, float]:
    """Ranks whose speed changed by more than `threshold`: rank -> new speed ÷ old speed."""
    changed = {}
    for rank, now in recent.items():
        before = baseline.get(rank)
        if before is None or before <= 0 or now <= 0:
            continue
        speed_ratio = before / now  # time per sample went up: the rank got slower
        if abs(speed_ratio - 1.0) > threshold:
            changed[rank] = speed_ratio
    return changed


def moved_between_splits(
    before_plan: Plan,
    before: JobMeasurements,
    after_plan: Plan,
    after: JobMeasurements,
    threshold: float = SPEED_CHANGE,
) -> dict[int, float]:
    """Ranks whose speed changed between two rounds run on different splits: rank -> new speed ÷ old.

    A rank's batch moved between the rounds, so its compute per step may differ without any change
    of speed, but only so far: compute that is a fixed cost plus a cost per sample (neither negative)
    grows with the batch, and never faster than the batch does. The host as a whole may also have
    run slower or faster by some factor. Each rank's compute allows a range of such factors (widened
    by `threshold` for noise); the factor that most ranks allow (the one nearest 1 among equals)
    explains them, and the ranks it does not explain changed speed."""
    computes_before = {w.rank: w.compute_seconds for w in before.workers}
    bounds: dict[int, tuple[float, float, float]] = {}  # rank -> compute now, least and most explained
    ranks = min(len(after_plan.local_batches), len(before_plan.local_batches))
    for worker in after.workers:
        rank, compute, was = worker.rank, worker.compute_seconds, computes_before.get(worker.rank, 0.0)
        if was <= 0 or compute <= 0 or rank >= ranks:
            continue
        batch_before, batch_after = before_plan.local_batches[rank], after_plan.local_batches[rank]
        if batch_before <= 0 or batch_after <= 0:
            continue  # no samples in one of the rounds: nothing to compare per sample
        growth = batch_after / batch_before
        bounds[rank] = (compute, was * min(1.0, growth), was * max(1.0, growth))
    spans = {
        rank: (compute / (most * (1 + threshold)), compute * (1 + threshold) / least)
        for rank, (compute, least, most) in bounds.items()
    }
    factors = {1.0, *(end for span in spans.values() for end in span)}

    def explained(factor: float) -> tuple[int, float]:
        return sum(low <= factor <= high for low, high in spans.values()), -abs(math.log(factor))

    host = max(factors, key=explained)
    moved = {}
    for rank, (low, high) in spans.items():
        compute, least, most = bounds[rank]
        if host < low:
            moved[rank] = most * host / compute  # slower than its new batch and the host explain
        elif host > high:
            moved[rank] = least * host / compute  # faster than they explain
    return moved


def describe(changed: Mapping[int, float]) -> str:
    """'rank 2 at 0.51x its speed, rank 0 at 1.3x': for the decision's reason."""
    return f"{SPEED_CHANGED}: " + ", ".join(
        f"rank {rank} at {ratio:.2g}x its speed" for rank, ratio in sorted(changed.items())
    )


def confirming_steps(first_window: JobMeasurements, least: int) -> int:
    """Steps a second look needs to confirm a change seen in `first_window`: half as many as that
    window had, and at least `least`. The change may have begun inside the first window, never
    inside the second, so half an epoch of steps is enough to judge it, and it comes half an epoch
    after a whole one; short epochs need more than half of theirs for a mean that holds."""
    return max(least, min(w.steps for w in first_window.workers) // 2)


def moved_within(
    before: Totals, looks: Sequence[Totals], after: Totals, plan: Plan, least_steps: int
) -> dict[int, float]:
    """Ranks whose speed moved inside the window from `before` to `after`: rank -> speed in its
    second part ÷ speed in its first, split at the look part-way through it (of `looks`) that leaves
    the most steps on both sides. A window that a change began inside shows only part of it, so its
    mean sizes no split. Empty when no look leaves `least_steps` steps of every rank on each side,
    which judges nothing."""
    best: tuple[int, JobMeasurements, JobMeasurements] | None = None
    for look in looks:
        first = window(before, look, plan.version, None)
        second = window(look, after, plan.version, None)
        if first is None or second is None:
            continue
        fewest = min(w.steps for w in (*first.workers, *second.workers))
        if fewest >= least_steps and (best is None or fewest > best[0]):
            best = (fewest, first, second)
    if best is None:
        return {}
    return changed_speeds(per_sample_seconds(best[1], plan), per_sample_seconds(best[2], plan))


def same_split_before(
    plans: Mapping[int, Plan], measured: Mapping[int, JobMeasurements], plan: Plan
) -> tuple[Plan, JobMeasurements] | None:
    """The newest measured plan before `plan` with the same total and split (a split gone back to)."""
    for version in sorted(plans, reverse=True):
        earlier = plans[version]
        if version >= plan.version or version not in measured:
            continue
        if earlier.local_batches == plan.local_batches and earlier.global_batch == plan.global_batch:
            return earlier, measured[version]
    return None
