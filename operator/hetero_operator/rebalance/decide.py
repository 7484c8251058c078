"""The rebalancing decision as a pure function: measurements and history in, the next plan (or why
not) out. Nothing here talks to Kubernetes or Prometheus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hetero_operator.plan import Plan, Strategy
from hetero_operator.planner import (
    ClusterModel,
    LrScaling,
    PlanningError,
    WorkerModel,
    WorkerSpec,
    choose_global_batch,
    lr_factor,
    next_split,
    optimal_split,
    predict_iteration_time,
)
from hetero_operator.planner.fitting import MIN_SLOPE_MS, SplitDecision, WarmupStage, fit_communication
from hetero_operator.planner.goodput import geometric_candidates
from hetero_operator.rebalance.history import History, at_latest_pace, split_balance, well_spread
from hetero_operator.rebalance.measurements import JobMeasurements
from hetero_operator.resources import HeteroTrainJobSpec

# When the fitted model misjudges the plan just measured by more than this, it is not trusted.
MAX_MODEL_ERROR = 0.25
# Strategies whose plan is a per-rank batch split the rebalancer can change between epochs. Not esync,
# whose workers all take the same batch by design (their speed shows in their local steps per round),
# nor hetpipe, whose stage cuts are re-planned instead (`stage_cuts`).
SPLIT_STRATEGIES = frozenset({Strategy.DATA, Strategy.DREAMDDP, Strategy.SESGD})
KEPT_SPLITS = {
    Strategy.ESYNC: "strategy esync keeps every worker's batch equal: its speed shows in its local steps",
    Strategy.HETPIPE: "strategy hetpipe keeps its split: its stage cuts follow the measured layer costs",
}


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
    model: ClusterModel | None = None  # the job's measured model behind the decision, by rank


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


@dataclass(frozen=True)
class Proposal:
    """A candidate next split and what the model that chose it predicts (ms per step)."""

    global_batch: int
    local_batches: tuple[int, ...]
    predicted_current_ms: float
    predicted_new_ms: float
    learning_rate_scale: float


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
        reason = KEPT_SPLITS.get(current.strategy, f"strategy {current.strategy.value} keeps its split")
        return RebalanceDecision(None, reason, "none", measured_s)
    workers = _worker_specs(current, policy)
    usable = well_spread(at_latest_pace(history))
    try:
        split = next_split(current.global_batch, workers, {str(r): s for r, s in usable.items()})
    except PlanningError as err:
        return RebalanceDecision(None, f"the planner found no split: {err}", "none", measured_s)
    if split.stage is WarmupStage.EVEN:
        return RebalanceDecision(
            None, "waiting for every worker's first measurement", split.stage.value, measured_s
        )
    fitted = split.cluster
    split = _trusted(split, current, workers, usable, measured_s)
    model = split.cluster if split.stage is WarmupStage.OPTPERF else None  # the one that sets the split
    proposal = _proposal(current, split, model, usable)
    if policy.adaptive and measured.noise_scale is not None and measured.noise_scale >= 0:
        model = model or speed_model(usable, workers)
        proposal = _adapt_total(current, proposal, fitted or model, model, policy, measured.noise_scale)
    decision = _conclude(current, proposal, split.stage.value, policy, measured_s, apply_at_epoch)
    return replace(decision, model=model or speed_model(usable, workers))


def _worker_specs(current: Plan, policy: BatchPolicy) -> list[WorkerSpec]:
    limits = policy.per_worker_max
    return [
        WorkerSpec(name=str(rank), min_batch=1, max_batch=limits[rank] if rank < len(limits) else None)
        for rank in range(current.world_size)
    ]


def _trusted(
    split: SplitDecision, current: Plan, workers: list[WorkerSpec], usable: History, measured_s: float
) -> SplitDecision:
    """The fitted model's split, unless that model does not explain what was just measured: then the
    split from per-sample speeds alone."""
    if split.stage is not WarmupStage.OPTPERF or split.cluster is None:
        return split
    model_error = abs(predict_iteration_time(split.cluster, current.local_batches) / 1e3 - measured_s)
    if model_error <= MAX_MODEL_ERROR * measured_s:
        return split
    latest = {str(rank): samples[-1:] for rank, samples in usable.items()}
    return next_split(current.global_batch, workers, latest)


def _proposal(current: Plan, split: SplitDecision, model: ClusterModel | None, usable: History) -> Proposal:
    new_batches = tuple(split.local_batches)
    if model is not None:
        predicted_current = predict_iteration_time(model, current.local_batches)
        predicted_new = split.predicted_ms or predict_iteration_time(model, new_batches)
    else:
        per_sample = _per_sample_ms(usable, current.world_size)
        predicted_current = _predict_ms(per_sample, current.local_batches)
        predicted_new = _predict_ms(per_sample, new_batches)
    return Proposal(
        current.global_batch, new_batches, predicted_current, predicted_new, current.learning_rate_scale
    )


def _adapt_total(
    current: Plan,
    proposal: Proposal,
    ranking: ClusterModel,
    model: ClusterModel,
    policy: BatchPolicy,
    noise_scale: float,
) -> Proposal:
    """A new total batch when goodput says so. Goodput ranks total batches the same under a model
    that is off by a constant factor, so a fit too far off to set the split still chooses the total
    (`ranking`; lines through the origin cannot see a step's fixed cost); the split at that total
    comes from the model that set the split."""
    candidates = geometric_candidates(policy.minimum, policy.maximum, count=24)
    best = choose_global_batch(ranking, candidates, noise_scale, policy.base_global_batch)
    if best.global_batch == current.global_batch:
        return proposal
    # Compare goodput (samples per ms weighted by statistical efficiency), not step time.
    now = choose_global_batch(ranking, [current.global_batch], noise_scale, policy.base_global_batch)
    if best.goodput < now.goodput * (1 + policy.min_improvement):
        return proposal
    chosen = optimal_split(model, best.global_batch)
    return Proposal(
        best.global_batch,
        tuple(chosen.local_batches),
        predict_iteration_time(model, current.local_batches),
        chosen.iteration_time,
        lr_factor(policy.lr_scaling, best.global_batch, policy.base_global_batch),
    )


def _conclude(
    current: Plan, proposal: Proposal, stage: str, policy: BatchPolicy, measured_s: float, apply_at: int
) -> RebalanceDecision:
    """The new plan if it is worth it, else why not."""
    before, after = proposal.predicted_current_ms, proposal.predicted_new_ms
    predictions = (measured_s, before / 1e3, after / 1e3)
    changed_batch = proposal.global_batch != current.global_batch
    gain = before / after - 1 if after > 0 else 0.0
    if proposal.local_batches == tuple(current.local_batches) and not changed_batch:
        return RebalanceDecision(None, "the current split is already the best predicted", stage, *predictions)
    if not changed_batch and gain < policy.min_improvement:
        reason = f"predicted gain {gain:.1%} is below the threshold {policy.min_improvement:.1%}"
        return RebalanceDecision(None, reason, stage, *predictions)
    plan = current.model_copy(
        update={
            "version": current.version + 1,
            "apply_at_epoch": apply_at,
            "global_batch": proposal.global_batch,
            "local_batches": list(proposal.local_batches),
            "learning_rate_scale": proposal.learning_rate_scale,
            "predicted_iteration_seconds": after / 1e3,
        }
    )
    Plan.model_validate(plan.model_dump())  # the copy skipped validation: check the new split adds up
    if changed_batch:
        reason = f"total batch {current.global_batch} -> {proposal.global_batch} for goodput ({stage})"
    else:
        reason = f"predicted step {before:.0f} ms -> {after:.0f} ms ({gain:+.0%}, {stage})"
    return RebalanceDecision(plan, reason, stage, *predictions)


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
