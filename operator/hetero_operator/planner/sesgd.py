"""SESGD: the shuffled groups every worker derives from a shared seed.

Specification (every rank computes it locally, so no coordination messages are needed):
one SplitMix64 stream seeded with the seed for the whole run; at each step a Fisher-Yates
shuffle of ``[0, n)`` (for i = n-1 down to 1: j = next() mod (i+1), swap), cut into ``k``
consecutive chunks of ``n/k`` ranks. Within a group, the ring order is the chunk order.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from hetero_operator.planner.errors import PlanningError

_MASK = (1 << 64) - 1


class SplitMix64:
    """The SplitMix64 generator (64-bit state, golden-gamma increment)."""

    def __init__(self, seed: int) -> None:
        self.state = seed & _MASK

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)


def _check(n: int, k: int) -> None:
    if n < 1 or k < 1:
        raise PlanningError("n and k: must be at least 1")
    if n % k:
        raise PlanningError(f"k: {n} workers cannot form {k} equal groups (n must be a multiple of k)")


def group_schedule(n: int, k: int, seed: int, steps: int) -> list[list[list[int]]]:
    """Groups for steps ``0 .. steps-1``: ``schedule[t][g]`` is group g's ranks in ring order."""
    _check(n, k)
    if steps < 0:
        raise PlanningError("steps: must be >= 0")
    rng = SplitMix64(seed)
    size = n // k
    out = []
    for _ in range(steps):
        perm = list(range(n))
        for i in range(n - 1, 0, -1):
            j = rng.next() % (i + 1)
            perm[i], perm[j] = perm[j], perm[i]
        out.append([perm[g * size : (g + 1) * size] for g in range(k)])
    return out


@dataclass(frozen=True, slots=True)
class RingPosition:
    group: int
    position: int
    members: tuple[int, ...]
    send_to: int
    receive_from: int


def ring_position(groups: list[list[int]], rank: int) -> RingPosition:
    """Where ``rank`` sits in one step's groups, with its ring neighbours."""
    for g, members in enumerate(groups):
        if rank in members:
            pos = members.index(rank)
            m = len(members)
            return RingPosition(g, pos, tuple(members), members[(pos + 1) % m], members[(pos - 1) % m])
    raise PlanningError(f"rank: {rank} is in no group")


def mixing_probability(n: int, k: int) -> Fraction:
    """P(two given workers are in different groups at one step) = n(k-1) / (k(n-1))."""
    _check(n, k)
    if n < 2:
        raise PlanningError("n: need at least two workers")
    return Fraction(n * (k - 1), k * (n - 1))


def ring_allreduce_ms(members: int, size_mb: float, mb_per_ms: float, latency_ms: float) -> float:
    """Ring all-reduce time of one tensor: 2(m-1) handshakes of size/m each."""
    if members < 1 or mb_per_ms <= 0:
        raise PlanningError("members must be >= 1 and mb_per_ms > 0")
    return 2 * (members - 1) * (size_mb / (members * mb_per_ms) + latency_ms)
