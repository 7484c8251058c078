"""Gradient noise scale measured from the norms the data strategy's all-reduce already carries.

The estimator itself (Cannikin's per-node estimates, minimum-variance weights) is the planner's; this
module only drops ranks that trained on nothing this step and smooths the noisy per-step values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero_operator.planner.goodput import noise_scale_estimates


@dataclass(frozen=True)
class NoiseEstimate:
    gradient_sq: float  # G, estimate of |E g|^2
    trace_sigma: float  # S, estimate of tr(Sigma)

    @property
    def noise_scale(self) -> float:
        """B_noise = S/G (inf when the signal estimate is not positive)."""
        return self.trace_sigma / self.gradient_sq if self.gradient_sq > 0 else float("inf")


def estimate_noise(
    local_batches: Sequence[int], local_sq_norms: Sequence[float], global_sq_norm: float
) -> NoiseEstimate | None:
    """G and S from one step, or None with fewer than two training ranks."""
    active = [(b, sq) for b, sq in zip(local_batches, local_sq_norms, strict=True) if b > 0]
    if len(active) < 2:
        return None
    gradient_sq, trace_sigma = noise_scale_estimates(
        [b for b, _ in active], [sq for _, sq in active], global_sq_norm
    )
    return NoiseEstimate(gradient_sq, trace_sigma)


class NoiseTracker:
    """Exponential moving averages of G and S (a single step's estimate is very noisy)."""

    def __init__(self, smoothing: float = 0.9) -> None:
        self.smoothing = smoothing
        self._g = 0.0
        self._s = 0.0
        self._weight = 0.0

    def update(self, estimate: NoiseEstimate | None) -> None:
        if estimate is None:
            return
        a = self.smoothing
        self._g = a * self._g + (1 - a) * estimate.gradient_sq
        self._s = a * self._s + (1 - a) * estimate.trace_sigma
        self._weight = a * self._weight + (1 - a)

    @property
    def estimate(self) -> NoiseEstimate | None:
        if self._weight == 0.0:
            return None
        return NoiseEstimate(self._g / self._weight, self._s / self._weight)
