"""Queues inside one cycle: the order they are served in, and the quota each placement must fit.

`FairShare` is built from a snapshot that has queues. It tracks, as the cycle decides, the GPUs each
queue holds per class (`quota.QuotaLedger`) and the rate each is charged (`charging`), so a queue's
share rises the moment one of its jobs is placed and the next pick sees it.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping

from hetero_operator.scheduler.charging import Charging, charge_rate, held_rates, share
from hetero_operator.scheduler.quota import QuotaLedger
from hetero_operator.scheduler.reservations import Budgets, HeadReservation
from hetero_operator.scheduler.snapshot import GPUClassInfo, JobRequest, Snapshot


def fair_order(
    jobs: Iterable[JobRequest], rank_of: Callable[[JobRequest], tuple[bool, float]]
) -> Iterator[JobRequest]:
    """Highest priority first; among equal priorities the next job of the queue that ranks lowest
    by ``rank_of`` (asked again before every pick: would it borrow, then its queue's share), then
    arrival and key; first come first served inside a queue."""
    lanes: dict[str, deque[JobRequest]] = {}
    for job in sorted(jobs, key=lambda j: (-j.priority, j.created_at, j.key)):
        lanes.setdefault(job.queue, deque()).append(job)

    def rank(queue: str) -> tuple[int, tuple[bool, float], float, str]:
        head = lanes[queue][0]
        return (-head.priority, rank_of(head), head.created_at, head.key)

    while lanes:
        queue = min(lanes, key=rank)
        job = lanes[queue].popleft()
        if not lanes[queue]:
            del lanes[queue]
        yield job


class FairShare:
    """Quota and share bookkeeping for one cycle over a snapshot with queues."""

    def __init__(self, snapshot: Snapshot, charging: Charging) -> None:
        self.charging = charging
        self.classes: Mapping[str, GPUClassInfo] = {c.name: c for c in snapshot.classes}
        self.queues = {q.name: q for q in snapshot.queues}
        holding = [(j, j.current.gpus_per_class()) for j in snapshot.jobs if j.current is not None]
        known = [(j, gpus) for j, gpus in holding if j.queue in self.queues]
        used: dict[str, Counter[str]] = {}
        for job, gpus in known:
            used.setdefault(job.queue, Counter()).update(gpus)
        self.ledger = QuotaLedger(snapshot.queues, used)
        self.capacity: Counter[str] = Counter()
        for node in snapshot.nodes:
            self.capacity[node.gpu_class] += node.gpus_allocatable
        self.rates = held_rates(known, self.classes, self.capacity, charging.pricing)

    def knows(self, queue: str) -> bool:
        return queue in self.queues

    def share(self, queue: str) -> float:
        if queue not in self.queues:
            return 0.0  # its jobs are refused at once; where they sort does not matter
        return share(self.queues[queue], self.rates.get(queue, 0.0), self.charging)

    def order(self, jobs: Iterable[JobRequest]) -> Iterator[JobRequest]:
        return fair_order(jobs, self.rank)

    def rank(self, job: JobRequest) -> tuple[bool, float]:
        """Jobs their queue's own quota can hold go before jobs that would borrow (as Kueue admits
        within nominal quota first): otherwise a borrower freed by a reclaim takes the GPUs back
        before their owner's job, and is reclaimed again. Then the lower share."""
        return (self.would_borrow(job), self.share(job.queue))

    def would_borrow(self, job: JobRequest) -> bool:
        if job.queue not in self.queues:
            return False
        owed = sum(
            min(self.ledger.owed(job.queue, c), self.capacity[c]) for c in self.classes if job.allows(c)
        )
        return owed < job.gpus_min

    def headroom(self, job: JobRequest) -> dict[str, int]:
        return {c: self.ledger.headroom(job.queue, c) for c in self.classes if job.allows(c)}

    def limit(self, job: JobRequest, budgets: Budgets) -> Budgets:
        """``budgets`` narrowed to what the job's queue may still take per class."""
        limited = budgets.copy()
        for gpu_class, room in self.headroom(job).items():
            limited.add(
                HeadReservation(f"quota {job.queue}/{gpu_class}", job.queue, frozenset({gpu_class}), room)
            )
        return limited

    def reclaimable(
        self, job: JobRequest, running: Iterable[JobRequest]
    ) -> tuple[frozenset[str], frozenset[str]]:
        """Classes on which the job's queue is owed nominal GPUs that other queues of its cohort
        borrow, and the running jobs of those borrowers holding such GPUs; empty when the queue is
        owed fewer GPUs than the job's gang (then it would borrow, not reclaim)."""
        queue = self.queues[job.queue]
        if queue.cohort is None:
            return frozenset(), frozenset()
        lenders = [q for q in self.queues.values() if q.cohort == queue.cohort and q.name != queue.name]
        classes = frozenset(
            c
            for c in self.classes
            if job.allows(c)
            and self.ledger.owed(queue.name, c) > 0
            and any(self.ledger.borrowed(q.name, c) > 0 for q in lenders)
        )
        if sum(self.ledger.owed(queue.name, c) for c in classes) < job.gpus_min:
            return frozenset(), frozenset()
        borrowers = {q.name for q in lenders if any(self.ledger.borrowed(q.name, c) > 0 for c in classes)}
        victims = frozenset(
            j.key
            for j in running
            if j.queue in borrowers
            and j.current is not None
            and any(j.current.gpus_per_class()[c] > 0 for c in classes)
        )
        return classes, victims

    def fits(self, job: JobRequest, gpus_per_class: Mapping[str, int]) -> bool:
        return self.ledger.fits(job.queue, gpus_per_class)

    def take(self, job: JobRequest, gpus_per_class: Mapping[str, int]) -> None:
        if job.queue in self.queues:
            self.ledger.take(job.queue, gpus_per_class)
            self._charge(job, gpus_per_class, 1.0)

    def give_back(self, job: JobRequest, gpus_per_class: Mapping[str, int]) -> None:
        if job.queue in self.queues:
            self.ledger.give_back(job.queue, gpus_per_class)
            self._charge(job, gpus_per_class, -1.0)

    def _charge(self, job: JobRequest, gpus_per_class: Mapping[str, int], sign: float) -> None:
        rate = charge_rate(job, gpus_per_class, self.classes, self.capacity, self.charging.pricing)
        self.rates[job.queue] = self.rates.get(job.queue, 0.0) + sign * rate
