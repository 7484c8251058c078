"""GPUs held back for queue heads that are waiting, so backfill never delays them.

Nobody knows when a running job ends, so "never delays the head" has to hold whichever running
jobs finish first. A head needing ``m`` GPUs from its allowed classes, with ``F`` of them free now,
can start once some set ``S`` of holders (running jobs, other workloads) has finished with
``F + held(S) >= m``. Backfilling ``x`` of those free GPUs is harmless exactly when every such ``S``
still suffices after losing them, i.e. ``x <= F + s_min - m`` where ``s_min`` is the smallest
subset sum of the holders' GPUs that reaches ``m - F``. Subset sums come from a bitset, so this is
cheap even with thousands of holders.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

NO_LIMIT = 1 << 60


def smallest_subset_sum_at_least(items: Iterable[int], target: int) -> int | None:
    """Smallest sum of a subset of ``items`` that is ``>= target``; ``None`` if even all fall short."""
    if target <= 0:
        return 0
    reachable = 1  # bit s set <=> some subset sums to s
    total = 0
    for size in items:
        if size > 0:
            reachable |= reachable << size
            total += size
    if total < target:
        return None
    at_least = reachable >> target
    return target + (at_least & -at_least).bit_length() - 1


def backfill_allowance(need: int, free: int, holder_sizes: Iterable[int]) -> int:
    """GPUs of the head's classes that later jobs may take now without delaying the head.

    ``need``: the head's gpus.min; ``free``: GPUs of its classes free for it now; ``holder_sizes``:
    GPUs of those classes held by each running job or other workload that may finish.
    """
    smallest = smallest_subset_sum_at_least(holder_sizes, need - free)
    if smallest is None:
        # Not even all holders leaving would let it start: no finish order can be delayed.
        return NO_LIMIT
    return free + smallest - need


@dataclass(slots=True)
class HeadReservation:
    """A waiting queue head and how many more GPUs of its classes later jobs may still take."""

    job: str
    queue: str
    classes: frozenset[str]
    allowance: int


class Budgets:
    """The joint limit every reservation puts on later jobs: GPUs taken from a head's classes count
    against that head's allowance."""

    def __init__(self, heads: list[HeadReservation]) -> None:
        self._heads = heads
        self._left = {h.job: h.allowance for h in heads}

    def add(self, head: HeadReservation) -> None:
        self._heads = [*self._heads, head]
        self._left[head.job] = head.allowance

    def copy(self) -> Budgets:
        clone = Budgets(self._heads)
        clone._left = dict(self._left)
        return clone

    def room(self, gpu_class: str) -> int:
        return min((self._left[h.job] for h in self._heads if gpu_class in h.classes), default=NO_LIMIT)

    def consume(self, gpu_class: str, count: int) -> None:
        for head in self._heads:
            if gpu_class in head.classes:
                self._left[head.job] -= count

    def limiting_head(self, gpu_class: str) -> HeadReservation | None:
        """The head whose allowance is the tightest on this class (for explanations)."""
        limiting = [h for h in self._heads if gpu_class in h.classes]
        return min(limiting, key=lambda h: (self._left[h.job], h.job), default=None)

    def commit(self, gpu_class: str, count: int) -> None:
        """Record GPUs really taken (the reservations' allowances shrink for good)."""
        self.consume(gpu_class, count)
        for head in self._heads:
            head.allowance = self._left[head.job]
