"""ESync: how many local steps each device takes per round so all finish together.

The slowest device takes one step; every other device takes as many steps as end at least
``epsilon`` before the slowest finishes: ``n_i = max(1, floor((C - epsilon) / c_i))`` with
``C = max_j c_j``. The arithmetic is exact on the decimal values given (no float rounding at
exact multiples, where the epsilon margin decides).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from hetero_operator.planner.errors import PlanningError


def _exact(value: float) -> Fraction:
    return Fraction(repr(float(value)))


def local_steps(step_ms: Sequence[float], epsilon_ms: float) -> list[int]:
    """Local SGD steps per device for one round, from each device's time per step (ms)."""
    if not step_ms:
        raise PlanningError("step_ms: at least one device is needed")
    if any(not math.isfinite(c) or c <= 0 for c in step_ms):
        raise PlanningError("step_ms: every step time must be positive and finite")
    if not math.isfinite(epsilon_ms) or epsilon_ms < 0:
        raise PlanningError("epsilon_ms: must be >= 0")
    steps = [_exact(c) for c in step_ms]
    budget = max(steps) - _exact(epsilon_ms)
    return [max(1, math.floor(budget / c)) for c in steps]


def idle_ms(step_ms: Sequence[float], steps: Sequence[int]) -> list[float]:
    """Time each device waits for the round's end (the slowest device's finish)."""
    busy = [c * n for c, n in zip(step_ms, steps, strict=True)]
    end = max(busy)
    return [end - b for b in busy]
