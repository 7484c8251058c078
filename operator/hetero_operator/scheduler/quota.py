"""Quota accounting per GPU class: how many more GPUs of a class a queue may take right now.

In the manner of Kueue's cohorts: per class, a cohort's members pool what they lend (their
``lendable`` GPUs); a queue's use beyond its ``guaranteed`` GPUs draws on that pool. So queue ``q``
may take ``x`` more GPUs of a class when

    used_q + x <= nominal_q + borrowing_limit_q                       (its own borrowing limit)
    pool_usage + (used_q + x - guaranteed_q)^+ - (used_q - guaranteed_q)^+ <= pool   (the cohort's)

where ``pool`` is the sum of the members' lendable GPUs and ``pool_usage`` the sum of their use
beyond what each guarantees itself. A queue outside any cohort is its own pool of its nominal GPUs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from hetero_operator.scheduler.queues import QueueInfo
from hetero_operator.scheduler.reservations import NO_LIMIT


class QuotaLedger:
    """GPUs each queue uses per class, updated as a cycle places, grows and preempts jobs."""

    def __init__(self, queues: Iterable[QueueInfo], used: Mapping[str, Mapping[str, int]]) -> None:
        self.queues = {q.name: q for q in queues}
        self.used: dict[str, Counter[str]] = {name: Counter(used.get(name, {})) for name in self.queues}
        self._members: dict[str, list[str]] = {}
        for queue in self.queues.values():
            if queue.cohort is not None:
                self._members.setdefault(queue.cohort, []).append(queue.name)

    def knows(self, queue: str) -> bool:
        return queue in self.queues

    def _pool(self, queue: QueueInfo) -> list[str]:
        return [queue.name] if queue.cohort is None else self._members[queue.cohort]

    def headroom(self, queue: str, gpu_class: str) -> int:
        """More GPUs of ``gpu_class`` the queue may take now (`NO_LIMIT` if nothing limits it)."""
        info = self.queues[queue]
        quota = info.quota(gpu_class)
        used = self.used[queue][gpu_class]
        if info.cohort is None:
            return max(0, quota.nominal - used)
        own_limit = (
            NO_LIMIT if quota.borrowing_limit is None else quota.nominal + quota.borrowing_limit - used
        )
        pool = pool_usage = 0
        for member in self._pool(info):
            member_quota = self.queues[member].quota(gpu_class)
            pool += member_quota.lendable
            pool_usage += max(0, self.used[member][gpu_class] - member_quota.guaranteed)
        from_pool = max(0, quota.guaranteed - used) + max(0, pool - pool_usage)
        return max(0, min(own_limit, from_pool))

    def fits(self, queue: str, gpus_per_class: Mapping[str, int]) -> bool:
        return all(count <= self.headroom(queue, c) for c, count in gpus_per_class.items() if count > 0)

    def take(self, queue: str, gpus_per_class: Mapping[str, int]) -> None:
        self.used[queue].update(gpus_per_class)

    def give_back(self, queue: str, gpus_per_class: Mapping[str, int]) -> None:
        self.used[queue].subtract(gpus_per_class)

    def borrowed(self, queue: str, gpu_class: str) -> int:
        """GPUs of the class the queue uses beyond its nominal quota (lent to it by its cohort)."""
        return max(0, self.used[queue][gpu_class] - self.queues[queue].quota(gpu_class).nominal)

    def owed(self, queue: str, gpu_class: str) -> int:
        """Nominal GPUs of the class the queue does not use: it may reclaim them from borrowers."""
        return max(0, self.queues[queue].quota(gpu_class).nominal - self.used[queue][gpu_class])
