"""DreamDDP: which layers to average in which iteration of a period of H local-SGD steps.

Layers are indexed in backward order (0 = output side). Layer b's backward ends at
``E_b = sum_{i<=b} backward_ms[i]``; its all-reduce may start then, on one serial link (the pipe
model): ``end = max(E_b, end) + comm_ms[b]`` folded over the synced layers in ascending order.
A phase's exposed time is ``max(0, end - T_BP)``; communication never overlaps the forward pass.

The layers are cut into H contiguous blocks (block h synced in phase h). A block's cost does not
depend on its phase, so an exact DP over (layers covered, blocks used) finds the partition with
the least total exposed time; ties go to the longest leading blocks. Bubble filling then lets each
later phase re-sync an output-side prefix whose communication finishes before the phase's own
block can start, so it costs no time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetero_operator.planner.errors import PlanningError

_TOL = 1e-9


@dataclass(frozen=True, slots=True)
class DreamSchedule:
    phases: tuple[tuple[int, ...], ...]  # H contiguous blocks in backward order (trailing ones may be empty)
    extra: tuple[tuple[int, ...], ...]  # bubble-filling layers per phase
    iteration_ms: tuple[float, ...]
    period_ms: float
    exposed_ms: float

    def phases_of_layer(self) -> dict[int, list[int]]:
        """Every phase in which each layer is averaged (its own block plus fills)."""
        out: dict[int, list[int]] = {}
        for h, (block, fill) in enumerate(zip(self.phases, self.extra, strict=True)):
            for b in (*fill, *block):
                out.setdefault(b, []).append(h)
        return {b: sorted(v) for b, v in sorted(out.items())}


def _validate(h: int, forward_ms: float, backward_ms: Sequence[float], comm_ms: Sequence[float]) -> None:
    if h < 1:
        raise PlanningError("H: the period must be at least 1")
    if not backward_ms:
        raise PlanningError("backward_ms: at least one layer is needed")
    if len(backward_ms) != len(comm_ms):
        raise PlanningError("comm_ms: needs one entry per layer, like backward_ms")
    if forward_ms < 0 or min(backward_ms) < 0 or min(comm_ms) < 0:
        raise PlanningError("forward_ms, backward_ms, comm_ms: times must be >= 0")


def comm_end(layers: Sequence[int], backward_end: Sequence[float], comm_ms: Sequence[float]) -> float:
    """When the serial link finishes syncing ``layers`` (0.0 if none)."""
    end = 0.0
    for b in sorted(layers):
        end = max(backward_end[b], end) + comm_ms[b]
    return end


def exposed_ms(layers: Sequence[int], backward_ms: Sequence[float], comm_ms: Sequence[float]) -> float:
    """Communication time of ``layers`` not hidden behind the backward pass (pipe model)."""
    ends = np.cumsum(np.asarray(backward_ms, dtype=np.float64))
    return max(0.0, comm_end(layers, [float(e) for e in ends], comm_ms) - float(ends[-1]))


def block_costs(backward_ms: Sequence[float], comm_ms: Sequence[float]) -> np.ndarray:
    """cost[i, j] = exposed time of syncing layers [i, j) in one phase (j > i)."""
    n = len(backward_ms)
    ends = np.cumsum(np.asarray(backward_ms, dtype=np.float64))
    total_bp = float(ends[-1])
    cost = np.full((n + 1, n + 1), np.inf)
    for i in range(n):
        end = 0.0
        for j in range(i, n):
            end = max(float(ends[j]), end) + float(comm_ms[j])
            cost[i, j + 1] = max(0.0, end - total_bp)
    return cost


def optimal_blocks(h: int, backward_ms: Sequence[float], comm_ms: Sequence[float]) -> list[list[int]]:
    """The contiguous partition into at most ``h`` blocks with the least total exposed time."""
    n = len(backward_ms)
    cost = block_costs(backward_ms, comm_ms)
    # rest[c, i]: least cost of covering layers [i, n) with at most c blocks.
    rest = np.full((h + 1, n + 1), np.inf)
    rest[:, n] = 0.0
    for c in range(1, h + 1):
        for i in range(n - 1, -1, -1):
            rest[c, i] = float(np.min(cost[i, i + 1 :] + rest[c - 1, i + 1 :]))
    blocks: list[list[int]] = []
    i = 0
    for c in range(h, 0, -1):
        if i == n:
            blocks.append([])
            continue
        target = rest[c, i]
        totals = cost[i, i + 1 :] + rest[c - 1, i + 1 :]
        fits = np.flatnonzero(totals <= target + _TOL * max(1.0, abs(target)))
        j = i + 1 + int(fits.max())  # longest block that stays optimal
        blocks.append(list(range(i, j)))
        i = j
    return blocks


def bubble_fill(
    blocks: Sequence[Sequence[int]], backward_ms: Sequence[float], comm_ms: Sequence[float]
) -> list[list[int]]:
    """Output-side layers each later phase can re-sync for free.

    Phase h >= 1 adds layers b = 0, 1, ... (already synced earlier in the period) while their
    pipelined communication ends by the time the phase's own block can start (the backward end of
    its first layer, or the whole backward pass for an empty phase); it stops at the first misfit.
    """
    ends = [float(e) for e in np.cumsum(np.asarray(backward_ms, dtype=np.float64))]
    n = len(ends)
    out: list[list[int]] = [[]]
    for block in blocks[1:]:
        first = block[0] if block else n
        window = ends[first] if block else ends[-1]
        fill: list[int] = []
        end = 0.0
        for b in range(first):
            end = max(ends[b], end) + comm_ms[b]
            if end > window + _TOL * max(1.0, window):
                break
            fill.append(b)
        out.append(fill)
    return out


def schedule(
    h: int, forward_ms: float, backward_ms: Sequence[float], comm_ms: Sequence[float]
) -> DreamSchedule:
    """Optimal DreamDDP schedule for a period of ``h`` iterations (see the module docstring)."""
    _validate(h, forward_ms, backward_ms, comm_ms)
    blocks = optimal_blocks(h, backward_ms, comm_ms)
    fills = bubble_fill(blocks, backward_ms, comm_ms)
    total_bp = float(np.sum(backward_ms))
    iteration = tuple(
        forward_ms + total_bp + exposed_ms([*fill, *block], backward_ms, comm_ms)
        for block, fill in zip(blocks, fills, strict=True)
    )
    exposed = sum(exposed_ms(block, backward_ms, comm_ms) for block in blocks)
    return DreamSchedule(
        phases=tuple(tuple(b) for b in blocks),
        extra=tuple(tuple(f) for f in fills),
        iteration_ms=iteration,
        period_ms=float(sum(iteration)),
        exposed_ms=float(exposed),
    )


def phase_of_step(step: int, h: int) -> int:
    """Phase of a global step (use the global step, not a per-epoch index)."""
    return step % h
