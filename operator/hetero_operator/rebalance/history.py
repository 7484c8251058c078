"""What the rebalancer keeps of every measured round: one sample per rank and plan version, brought
to one pace before lines are fitted through them (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hetero_operator.plan import Plan
from hetero_operator.planner import PerfSample
from hetero_operator.rebalance.measurements import JobMeasurements

HISTORY_PER_WORKER = 8
# A worker's linear model is only fitted from batch sizes at least this far apart (relative to their
# mean): two nearly equal batches turn measurement noise into a wild slope.
MIN_RELATIVE_SPREAD = 0.1

History = Mapping[int, Sequence[PerfSample]]


def _batches_and_computes(plan: Plan, measured: JobMeasurements) -> list[tuple[int, float]]:
    """(local batch, mean compute seconds) of every rank that computed something under `plan`."""
    out = []
    for worker in measured.workers:
        batch = plan.local_batches[worker.rank] if worker.rank < len(plan.local_batches) else 0
        if batch > 0 and worker.compute_seconds > 0:
            out.append((batch, worker.compute_seconds))
    return out


def pace_ms(plan: Plan, measured: JobMeasurements) -> float | None:
    """The whole cluster's compute time per sample in one measured round: 1 / sum(b_i / c_i)."""
    pairs = _batches_and_computes(plan, measured)
    rate = sum(batch / seconds for batch, seconds in pairs)
    return 1e3 / rate if pairs and rate > 0 else None


def split_balance(plan: Plan, measured: JobMeasurements) -> float | None:
    """How close one measured round came to equal finish times, from that round alone: the compute
    time a perfect split of its total would take at the per-sample speeds it measured, over its
    slowest worker's compute time (1 = balanced). A host or cluster that runs slower or faster as a
    whole between rounds scales every worker alike, which cancels here; it does not cancel in a
    comparison of two rounds' step times."""
    pairs = _batches_and_computes(plan, measured)
    pace = pace_ms(plan, measured)
    if pace is None or len(pairs) != len(measured.workers):
        return None
    total = sum(batch for batch, _ in pairs)
    return total * pace / 1e3 / max(seconds for _, seconds in pairs)


def record(history: History, measured: JobMeasurements, plan: Plan) -> dict[int, list[PerfSample]]:
    """History with one sample per rank added for the plan just measured (bounded, oldest dropped)."""
    updated = {rank: list(samples) for rank, samples in history.items()}
    pace = pace_ms(plan, measured)
    for worker in measured.workers:
        batch = plan.local_batches[worker.rank] if worker.rank < len(plan.local_batches) else 0
        if batch <= 0:
            continue
        sample = PerfSample(
            batch=batch,
            compute_ms=worker.compute_seconds * 1e3,
            sync_start_ms=worker.sync_start_seconds * 1e3,
            comm_ms=worker.comm_seconds * 1e3,
            pace_ms=pace,
        )
        updated[worker.rank] = [*updated.get(worker.rank, []), sample][-HISTORY_PER_WORKER:]
    return updated


def at_latest_pace(history: History) -> dict[int, list[PerfSample]]:
    """Every sample's compute brought to the pace of the newest round (the newest samples').

    The workers of one round share its pace, so a round in which the whole host or cluster ran
    slower (another tenant, a warmer chip) does not bend the fitted lines: a line fitted through two
    rounds 8% apart in pace, with batch sizes 10% apart, gets a slope off by most of its value. The
    pace barely depends on the split itself (a per-step fixed cost of 40% of an even split's compute
    moves it by 2.4% between the even and the balanced split, and OptPerf's split by 0.4%), so true
    fixed costs are kept."""
    newest = {samples[-1].pace_ms for samples in history.values() if samples}
    latest = newest.pop() if len(newest) == 1 else None
    if latest is None or latest <= 0:
        return {rank: list(samples) for rank, samples in history.items()}
    return {
        rank: [
            s
            if s.pace_ms is None or s.pace_ms <= 0
            else replace(
                s,
                compute_ms=s.compute_ms * latest / s.pace_ms,
                sync_start_ms=s.sync_start_ms * latest / s.pace_ms,
                pace_ms=latest,
            )
            for s in samples
        ]
        for rank, samples in history.items()
    }


def well_spread(history: History) -> dict[int, list[PerfSample]]:
    """History in which a worker whose batch sizes are too close to fit a line keeps only its latest
    batch size (so the planner stays with the inverse-time split for it)."""
    out: dict[int, list[PerfSample]] = {}
    for rank, samples in history.items():
        batches = [s.batch for s in samples]
        if not batches:
            continue
        spread = (max(batches) - min(batches)) / (sum(batches) / len(batches))
        latest = batches[-1]
        out[rank] = (
            list(samples) if spread >= MIN_RELATIVE_SPREAD else [s for s in samples if s.batch == latest]
        )
    return out
