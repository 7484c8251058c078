"""Choosing the total batch by goodput, estimating the gradient-noise scale, scaling the LR.

goodput(B) = throughput(B) * efficiency(B), with throughput = B / OptPerf(B) and statistical
efficiency (phi + B0) / (phi + B), where phi is the (preconditioned) gradient-noise scale and B0
the batch the learning rate was tuned for.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from hetero_operator.planner.batch import ClusterModel, continuous_split
from hetero_operator.planner.errors import PlanningError


@dataclass(frozen=True, slots=True)
class GoodputPoint:
    global_batch: int
    opt_perf_ms: float
    efficiency: float
    goodput: float  # samples per ms, weighted by statistical efficiency


def efficiency(global_batch: float, noise_scale: float, base_batch: float) -> float:
    """Statistical efficiency of batch B relative to B0 given the gradient-noise scale."""
    if noise_scale < 0 or base_batch <= 0:
        raise PlanningError("noise_scale must be >= 0 and base_batch > 0")
    return (noise_scale + base_batch) / (noise_scale + global_batch)


def goodput_table(
    cluster: ClusterModel, candidates: Sequence[int], noise_scale: float, base_batch: float
) -> list[GoodputPoint]:
    """Goodput of every candidate total batch, using the exact OptPerf of each."""
    out = []
    for b in candidates:
        perf = continuous_split(cluster, float(b)).opt_perf
        eff = efficiency(b, noise_scale, base_batch)
        out.append(GoodputPoint(int(b), perf, eff, b / perf * eff))
    return out


def choose_global_batch(
    cluster: ClusterModel, candidates: Sequence[int], noise_scale: float, base_batch: float
) -> GoodputPoint:
    """The candidate with the highest goodput (ties: the smaller batch)."""
    if not candidates:
        raise PlanningError("candidates: at least one total batch is needed")
    table = goodput_table(cluster, sorted(set(candidates)), noise_scale, base_batch)
    return max(table, key=lambda p: (p.goodput, -p.global_batch))


def geometric_candidates(smallest: int, largest: int, count: int = 50) -> list[int]:
    """Up to ``count`` distinct integers spaced geometrically over [smallest, largest]."""
    if smallest < 1 or largest < smallest or count < 1:
        raise PlanningError("candidates: need 1 <= smallest <= largest and count >= 1")
    values = np.geomspace(smallest, largest, num=count)
    return sorted({round(float(v)) for v in values} | {smallest, largest})


def noise_scale_estimates(
    local_batches: Sequence[int],
    local_sq_norms: Sequence[float],
    global_sq_norm: float,
    *,
    paper_weights: bool = False,
) -> tuple[float, float]:
    """Unbiased ``(|G|^2, tr(Sigma))`` from per-worker and global gradient square norms.

    Per-worker estimates follow Cannikin Eq. 10. They are combined with weights
    ``(B - b_i) / ((n - 1) B)``, which have lower variance than the paper's Theorem 4.1 weights
    (those can go negative); ``paper_weights=True`` uses Theorem 4.1 instead. ``B_noise = S / G``.
    """
    b = np.asarray(local_batches, dtype=np.float64)
    g_i = np.asarray(local_sq_norms, dtype=np.float64)
    n = b.size
    if n < 2 or g_i.shape != b.shape:
        raise PlanningError("local_batches: need at least two workers and one norm per worker")
    if np.any(b <= 0):
        raise PlanningError("local_batches: every local batch must be positive")
    total = b.sum()
    g_est = (total * global_sq_norm - b * g_i) / (total - b)
    s_est = b * total / (total - b) * (g_i - global_sq_norm)
    if paper_weights:
        w_g, w_s = theorem_weights(b)
    else:
        w_g = w_s = (total - b) / ((n - 1) * total)
    return float(w_g @ g_est), float(w_s @ s_est)


def theorem_weights(local_batches: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cannikin Theorem 4.1 weights ``1^T A^-1 / (1^T A^-1 1)`` for the G and S estimates."""
    b = np.asarray(local_batches, dtype=np.float64)
    total = b.sum()
    bi, bj = b[:, None], b[None, :]
    a_g = (total**2 - bi**2 - bj**2) / (total * (total - bi) * (total - bj))
    a_s = bi * bj * (total - bi - bj) / ((total - bi) * (total - bj))
    np.fill_diagonal(a_g, (total + 2 * b) / (total**2 - total * b))
    np.fill_diagonal(a_s, total * b / (total - b))

    def weights(a: np.ndarray) -> np.ndarray:
        row = np.linalg.solve(a.T, np.ones(b.size))
        return np.asarray(row / row.sum(), dtype=np.float64)

    return weights(a_g), weights(a_s)


class LrScaling(StrEnum):
    ADASCALE = "adascale"  # SGD
    SQRT = "sqrt"  # Adam / AdamW
    NONE = "none"


def lr_factor(
    rule: LrScaling, global_batch: float, base_batch: float, var: float = 0.0, sqr: float = 1.0
) -> float:
    """Learning-rate multiplier for batch B tuned at B0.

    AdaScale: ``(var + sqr) / (var / S + sqr)`` with ``S = B / B0``, ``var = tr(Sigma)/B0`` and
    ``sqr = |G|^2``; square root: ``sqrt(S)``.
    """
    if base_batch <= 0 or global_batch <= 0:
        raise PlanningError("global_batch and base_batch must be positive")
    scale = global_batch / base_batch
    if rule is LrScaling.SQRT:
        return math.sqrt(scale)
    if rule is LrScaling.ADASCALE:
        if var < 0 or sqr < 0 or var + sqr == 0:
            raise PlanningError("var and sqr must be non-negative and not both zero")
        return (var + sqr) / (var / scale + sqr)
    return 1.0
