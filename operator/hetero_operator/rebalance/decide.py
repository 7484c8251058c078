"""The rebalancing decision as a pure function: measurements and history in, the next plan (or why
not) out. Nothing here talks to Kubernetes or Prometheus."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hetero_operator.plan import Plan, Strategy
from hetero_operator.planner import (
    ClusterModel,
    LrScaling,
    PerfSample,
    PlanningError,
    WorkerModel,
    WorkerSpec,
    choose_global_batch,
    lr_factor,
    next_split,
    optimal_split,
    predict_iteration_time,
)
from hetero_operator.planner.fitting import MIN_SLOPE_MS, WarmupStage, fit_communication
from hetero_operator.planner.goodput import geometric_candidates
from hetero_operator.rebalance.measurements import JobMeasurements
from hetero_operator.resources import HeteroTrainJobSpec

HISTORY_PER_WORKER = 8
# A worker's linear model is only fitted from batch sizes at least this far apart (relative to their
# mean): two nearly equal batches turn measurement noise into a wild slope.
MIN_RELATIVE_SPREAD = 0.1
# When the fitted model misjudges the plan just measured by more than this, it is not trusted.
MAX_MODEL_ERROR = 0.25
# Strategies whose plan is a per-rank batch split the rebalancer can change between epochs.
SPLIT_STRATEGIES = frozenset({Strategy.DATA, Strategy.ESYNC, Strategy.DREAMDDP, Strategy.SESGD})

History = Mapping[int, Sequence[PerfSample]]


@dataclass(frozen=True)
class BatchPolicy:
    """What the job's spec allows the rebalancer to do."""

    base_global_batch: int
    minimum: int
    maximum: int
    adaptive: bool
    min_improvement: float
    per_worker_max: tuple[int | None, ...]
    lr_scaling: LrScaling = LrScaling.SQRT


def batch_policy(spec: HeteroTrainJobSpec, classes: Sequence[str]) -> BatchPolicy:
    """What the job's spec lets the rebalancer do, for workers of `classes` (by rank)."""
    batch = spec.batch
    return BatchPolicy(
        base_global_batch=batch.global_batch,
        minimum=batch.lowest,
        maximum=batch.highest,
        adaptive=batch.adaptive,
        min_improvement=spec.rebalance.min_improvement,
        per_worker_max=tuple(batch.per_gpu_class_max.get(c) for c in classes),
        lr_scaling=LrScaling.SQRT,
    )


@dataclass(frozen=True)
class RebalanceDecision:
    plan: Plan | None
    reason: str
    stage: str
    measured_seconds: float
    predicted_current_seconds: float | None = None
    predicted_new_seconds: float | None = None


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


def measured_iteration_seconds(measured: JobMeasurements) -> float:
    """A synchronous step ends when the slowest rank ends: the largest mean step time."""
    return max(w.step_seconds for w in measured.workers)


def _per_sample_ms(history: History, ranks: int) -> list[float]:
    out = []
    for rank in range(ranks):
        latest = history[rank][-1]
        out.append(latest.compute_ms / max(latest.batch, 1))
    return out


def speed_model(history: History, workers: Sequence[WorkerSpec]) -> ClusterModel:
    """Each worker's latest per-sample times as lines through the origin, with the measured
    communication as the fixed cost of a step: the model behind the inverse-time split."""
    per_sample = _per_sample_ms(history, len(workers))
    models = []
    for rank, spec in enumerate(workers):
        latest = history[rank][-1]
        models.append(
            WorkerModel(
                alpha=max(per_sample[rank], MIN_SLOPE_MS),
                beta=0.0,
                alpha_sync=max(latest.sync_start_ms / max(latest.batch, 1), 0.0),
                beta_sync=0.0,
                min_batch=spec.min_batch,
                max_batch=spec.max_batch,
                name=spec.name,
            )
        )
    t_o, t_u = fit_communication([history[rank] for rank in range(len(workers))])
    return ClusterModel(tuple(models), t_o=t_o, t_u=t_u)


def _predict_ms(per_sample_ms: Sequence[float], batches: Sequence[int]) -> float:
    return float(np.max(np.asarray(per_sample_ms) * np.asarray(batches)))


def decide(
    current: Plan,
    history: History,
    policy: BatchPolicy,
    measured: JobMeasurements,
    apply_at_epoch: int,
) -> RebalanceDecision:
    """The next plan, written only when its predicted gain reaches `policy.min_improvement`."""
    measured_s = measured_iteration_seconds(measured)
    if current.strategy not in SPLIT_STRATEGIES:
        return RebalanceDecision(
            None, f"strategy {current.strategy.value} keeps its split", "none", measured_s
        )
    ranks = current.world_size
    workers = [
        WorkerSpec(
            name=str(rank),
            min_batch=1,
            max_batch=policy.per_worker_max[rank] if rank < len(policy.per_worker_max) else None,
        )
        for rank in range(ranks)
    ]
    usable = well_spread(at_latest_pace(history))
    named = {str(rank): samples for rank, samples in usable.items()}
    global_batch = current.global_batch
    try:
        split = next_split(global_batch, workers, named)
    except PlanningError as err:
        return RebalanceDecision(None, f"the planner found no split: {err}", "none", measured_s)
    if split.stage is WarmupStage.EVEN:
        return RebalanceDecision(
            None, "waiting for every worker's first measurement", split.stage.value, measured_s
        )

    lr_scale = current.learning_rate_scale
    fitted = split.cluster
    if split.stage is WarmupStage.OPTPERF and split.cluster is not None:
        model_error = abs(predict_iteration_time(split.cluster, current.local_batches) / 1e3 - measured_s)
        if model_error > MAX_MODEL_ERROR * measured_s:
            # The fitted model does not explain what was just measured: fall back to speeds alone.
            latest = {str(rank): samples[-1:] for rank, samples in usable.items()}
            split = next_split(global_batch, workers, latest)
    model = split.cluster if split.stage is WarmupStage.OPTPERF else None  # the one that sets the split
    new_batches = split.local_batches
    if model is not None:
        predicted_current = predict_iteration_time(model, current.local_batches)
        predicted_new = split.predicted_ms or predict_iteration_time(model, new_batches)
    else:
        per_sample = _per_sample_ms(usable, ranks)
        predicted_current = _predict_ms(per_sample, current.local_batches)
        predicted_new = _predict_ms(per_sample, new_batches)
    if policy.adaptive and measured.noise_scale is not None and measured.noise_scale >= 0:
        # Goodput ranks total batches the same under a model that is off by a constant factor, so a
        # fit too far off to set the split still chooses the total (lines through the origin cannot
        # see a step's fixed cost); the split at that total comes from the model that set the split.
        if model is None:
            model = speed_model(usable, workers)
        ranking = fitted if fitted is not None else model
        candidates = geometric_candidates(policy.minimum, policy.maximum, count=24)
        best = choose_global_batch(ranking, candidates, measured.noise_scale, policy.base_global_batch)
        if best.global_batch != global_batch:
            # Compare goodput (samples per ms weighted by statistical efficiency), not step time.
            table_now = choose_global_batch(
                ranking, [global_batch], measured.noise_scale, policy.base_global_batch
            )
            if best.goodput >= table_now.goodput * (1 + policy.min_improvement):
                chosen = optimal_split(model, best.global_batch)
                predicted_current = predict_iteration_time(model, current.local_batches)
                global_batch = best.global_batch
                new_batches = chosen.local_batches
                predicted_new = chosen.iteration_time
                lr_scale = lr_factor(policy.lr_scaling, global_batch, policy.base_global_batch)

    changed_batch = global_batch != current.global_batch
    gain = predicted_current / predicted_new - 1 if predicted_new > 0 else 0.0
    if tuple(new_batches) == tuple(current.local_batches) and not changed_batch:
        reason = "the current split is already the best predicted"
        return RebalanceDecision(
            None, reason, split.stage.value, measured_s, predicted_current / 1e3, predicted_new / 1e3
        )
    if not changed_batch and gain < policy.min_improvement:
        reason = f"predicted gain {gain:.1%} is below the threshold {policy.min_improvement:.1%}"
        return RebalanceDecision(
            None, reason, split.stage.value, measured_s, predicted_current / 1e3, predicted_new / 1e3
        )
    plan = current.model_copy(
        update={
            "version": current.version + 1,
            "apply_at_epoch": apply_at_epoch,
            "global_batch": global_batch,
            "local_batches": list(new_batches),
            "learning_rate_scale": lr_scale,
            "predicted_iteration_seconds": predicted_new / 1e3,
        }
    )
    Plan.model_validate(plan.model_dump())  # the copy skipped validation: check the new split adds up
    if changed_batch:
        reason = f"total batch {current.global_batch} -> {global_batch} for goodput ({split.stage.value})"
    else:
        step = f"{predicted_current:.0f} ms -> {predicted_new:.0f} ms"
        reason = f"predicted step {step} ({gain:+.0%}, {split.stage.value})"
    return RebalanceDecision(
        plan, reason, split.stage.value, measured_s, predicted_current / 1e3, predicted_new / 1e3
    )


def confirm(
    current: Plan,
    measured: JobMeasurements,
    previous: Plan,
    previous_measured: JobMeasurements,
    min_improvement: float,
    apply_at_epoch: int,
) -> RebalanceDecision | None:
    """Check the last rebalance against measurement, not prediction.

    None: it paid off, keep rebalancing. Otherwise a final decision: go back to the previous split
    when the new one measured slower, or stay (converged) when it measured about the same. Either
    way no later prediction moves the split again, so the job never drifts on modelling noise.

    A new split of the same total is judged by its balance within its own round (`split_balance`),
    which a host or cluster slowing down as a whole between the two rounds does not move; a new
    total batch, by samples per second."""
    measured_s = measured_iteration_seconds(measured)
    balance_now, balance_before = split_balance(current, measured), split_balance(previous, previous_measured)
    if current.global_batch == previous.global_batch and balance_now and balance_before:
        now, before, what = balance_now, balance_before, "balance"
    else:
        now = current.global_batch / measured_s
        before = previous.global_batch / measured_iteration_seconds(previous_measured)
        what = "throughput"
    if now >= before * (1 + min_improvement / 2):
        return None
    if now >= before:
        reason = (
            f"converged: v{current.version} measured {what} {now / before - 1:+.1%} against "
            f"v{previous.version}"
        )
        return RebalanceDecision(None, reason, "converged", measured_s)
    plan = current.model_copy(
        update={
            "version": current.version + 1,
            "apply_at_epoch": apply_at_epoch,
            "global_batch": previous.global_batch,
            "local_batches": list(previous.local_batches),
            "learning_rate_scale": previous.learning_rate_scale,
            "predicted_iteration_seconds": measured_iteration_seconds(previous_measured),
        }
    )
    reason = (
        f"back to v{previous.version}'s split: v{current.version} measured {what} {now / before - 1:+.1%}"
    )
    return RebalanceDecision(
        plan, reason, "converged", measured_s, measured_s, measured_iteration_seconds(previous_measured)
    )
