"""Learning the batch performance model online, and the warm-up schedule that feeds it.

A linear model needs two distinct local batch sizes per worker, so the first epochs cannot use
OptPerf: epoch 1 splits evenly, the next epoch splits inversely to the measured per-sample time
(which also hands every worker a second batch size), and from then on OptPerf is used.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from hetero_operator.planner.batch import (
    ClusterModel,
    WorkerModel,
    even_split,
    optimal_split,
    proportional_split,
)
from hetero_operator.planner.errors import PlanningError

# Slopes are clamped to this floor (ms per sample) so noise can never produce a free worker.
MIN_SLOPE_MS = 1e-6


@dataclass(frozen=True, slots=True)
class PerfSample:
    """One measured iteration of one worker (times in ms).

    ``compute_ms``: forward + backward + update; ``sync_start_ms``: from iteration start until the
    first gradient bucket starts syncing; ``comm_ms``: from that moment to the end of the last
    bucket's all-reduce; ``last_bucket_ms``: the last bucket's all-reduce alone (``t_u``), if known;
    ``pace_ms``: the whole cluster's compute time per sample in the round the sample comes from
    (1 / sum over workers of batch / compute), if known: samples of rounds run at different paces
    can be brought to one pace before a fit.
    """

    batch: int
    compute_ms: float
    sync_start_ms: float
    comm_ms: float
    last_bucket_ms: float | None = None
    pace_ms: float | None = None


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Identity and batch bounds of a worker whose model is being learnt."""

    name: str
    min_batch: int = 1
    max_batch: int | None = None


def robust_line(batches: Sequence[float], times: Sequence[float]) -> tuple[float, float]:
    """Fit ``time = slope*batch + intercept`` robustly.

    Each distinct batch size is reduced to the median of its samples (outliers within an epoch do
    not matter), then two points give the exact line and three or more a Theil-Sen fit (an outlying
    batch size does not matter either). Raises if fewer than two distinct batch sizes exist.
    """
    groups: dict[float, list[float]] = defaultdict(list)
    for b, t in zip(batches, times, strict=True):
        groups[float(b)].append(float(t))
    if len(groups) < 2:
        raise PlanningError("samples: a linear model needs at least two distinct batch sizes")
    xs = np.array(sorted(groups), dtype=np.float64)
    ys = np.array([np.median(groups[x]) for x in xs], dtype=np.float64)
    if xs.size == 2:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        intercept = ys[0] - slope * xs[0]
    else:
        from scipy import stats  # imported here: scipy.stats is slow to import and rarely needed

        result = stats.theilslopes(ys, xs)
        slope, intercept = float(result.slope), float(result.intercept)
    slope = max(float(slope), MIN_SLOPE_MS)
    # With a clamped slope, re-centre the intercept on the medians so the line stays honest.
    intercept = float(np.median(ys - slope * xs)) if slope == MIN_SLOPE_MS else float(intercept)
    return slope, max(intercept, 0.0)


def fit_worker(spec: WorkerSpec, samples: Sequence[PerfSample]) -> WorkerModel | None:
    """Fit one worker's compute and sync-start lines; ``None`` until two batch sizes were measured."""
    if len({s.batch for s in samples}) < 2:
        return None
    batches = [s.batch for s in samples]
    alpha, beta = robust_line(batches, [s.compute_ms for s in samples])
    alpha_sync, beta_sync = robust_line(batches, [s.sync_start_ms for s in samples])
    return WorkerModel(
        alpha=alpha,
        beta=beta,
        alpha_sync=alpha_sync,
        beta_sync=beta_sync,
        min_batch=spec.min_batch,
        max_batch=spec.max_batch,
        name=spec.name,
    )


def fit_communication(samples_per_worker: Sequence[Sequence[PerfSample]]) -> tuple[float, float]:
    """``(t_o, t_u)`` from measured communication.

    Every worker's measured comm time includes waiting for stragglers, so the cluster's comm time
    is the smallest per-worker median. ``t_u`` is the median last-bucket time (0 if never measured).
    """
    medians = [float(np.median([s.comm_ms for s in ws])) for ws in samples_per_worker if ws]
    if not medians:
        raise PlanningError("samples: no communication measurements")
    t_comm = min(medians)
    last = [s.last_bucket_ms for ws in samples_per_worker for s in ws if s.last_bucket_ms is not None]
    t_u = min(float(np.median(last)), t_comm) if last else 0.0
    return max(t_comm - t_u, 0.0), t_u


def components_from_model(model: WorkerModel, gamma: float) -> tuple[float, float, float, float]:
    """Recover Cannikin's ``(q, s, k, m)`` from a fitted model and the overlap ratio ``gamma < 1``."""
    if not 0.0 <= gamma < 1.0:
        raise PlanningError("gamma: must be in [0, 1) to separate forward and backward time")
    k = (model.alpha - model.alpha_sync) / (1.0 - gamma)
    m = (model.beta - model.beta_sync) / (1.0 - gamma)
    return model.alpha - k, model.beta - m, k, m


def combine_gamma(means: Sequence[float], variances: Sequence[float]) -> float:
    """Inverse-variance weighted overlap ratio across workers (Cannikin Eq. 12).

    Workers with zero variance are exact: their plain mean is used alone.
    """
    mu = np.asarray(means, dtype=np.float64)
    var = np.asarray(variances, dtype=np.float64)
    if mu.size == 0 or mu.shape != var.shape:
        raise PlanningError("gamma: need one variance per mean, and at least one worker")
    if np.any(var < 0):
        raise PlanningError("gamma: variances must be non-negative")
    exact = var == 0
    if exact.any():
        return float(mu[exact].mean())
    w = 1.0 / var
    return float((w * mu).sum() / w.sum())


class WarmupStage(StrEnum):
    EVEN = "even"
    INVERSE_TIME = "inverse_time"
    OPTPERF = "optperf"


@dataclass(frozen=True, slots=True)
class SplitDecision:
    """What the warm-up schedule decided for the next epoch."""

    local_batches: tuple[int, ...]
    stage: WarmupStage
    predicted_ms: float | None
    cluster: ClusterModel | None


def inverse_time_split(
    global_batch: int,
    per_sample_ms: Sequence[float],
    min_batches: Sequence[int],
    max_batches: Sequence[float],
) -> tuple[int, ...]:
    """Cannikin Eq. 8: local batches proportional to ``1 / t_sample`` (integer, within bounds)."""
    t = np.asarray(per_sample_ms, dtype=np.float64)
    if np.any(t <= 0):
        raise PlanningError("per_sample_ms: every per-sample time must be positive")
    return proportional_split(global_batch, list(1.0 / t), min_batches, max_batches)


def next_split(
    global_batch: int,
    workers: Sequence[WorkerSpec],
    history: Mapping[str, Sequence[PerfSample]],
) -> SplitDecision:
    """The split for the next epoch, from everything measured so far.

    ``history`` maps a worker name to its samples (any number per epoch). Stages: no samples for
    some worker -> even split; some worker has seen only one batch size -> inverse per-sample time
    (from each worker's latest batch size); otherwise fit the models and return OptPerf's split.
    """
    lo = [w.min_batch for w in workers]
    hi = [float("inf") if w.max_batch is None else float(w.max_batch) for w in workers]
    samples = [list(history.get(w.name, ())) for w in workers]
    if any(not s for s in samples):
        return SplitDecision(even_split(global_batch, lo, hi), WarmupStage.EVEN, None, None)
    models = [fit_worker(w, s) for w, s in zip(workers, samples, strict=True)]
    if any(m is None for m in models):
        per_sample = []
        for s in samples:
            latest = s[-1].batch
            times = [x.compute_ms for x in s if x.batch == latest]
            per_sample.append(float(np.median(times)) / max(latest, 1))
        split = inverse_time_split(global_batch, per_sample, lo, hi)
        return SplitDecision(split, WarmupStage.INVERSE_TIME, None, None)
    t_o, t_u = fit_communication(samples)
    cluster = ClusterModel(tuple(m for m in models if m is not None), t_o=t_o, t_u=t_u)
    best = optimal_split(cluster, global_batch)
    return SplitDecision(best.local_batches, WarmupStage.OPTPERF, best.iteration_time, cluster)
