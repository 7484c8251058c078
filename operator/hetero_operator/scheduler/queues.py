"""Queues as the scheduler sees them: a weight, GPU quotas per class and a cohort to borrow within.

A snapshot without queues schedules as one unlimited queue (no quotas, no fair share). Once it has
any, every job must name one of them (a job whose spec.queue names none waits with reason
UnknownQueue, naming the field); jobs a Kueue queue admitted keep to what Kueue admitted.

Per class, a queue's ``nominal`` GPUs are its own; it may use up to ``borrowing_limit`` more (unset:
no limit) from what the other queues of its cohort lend, and lends at most ``lending_limit`` of its
own nominal GPUs (unset: all of them) while it does not use them. A class a queue lists no quota for
counts as nominal 0: its jobs may use it only by borrowing. A queue outside any cohort never
borrows or lends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hetero_operator.resources.queue import HeteroQueueSpec
from hetero_operator.scheduler.snapshot_errors import require


@dataclass(frozen=True, slots=True)
class ClassQuota:
    """GPUs of one class a queue owns, may borrow and may lend (see the module docstring)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    def __post_init__(self) -> None:
        require(self.nominal >= 0, f"nominal: must be >= 0, got {self.nominal}")
        require(
            self.borrowing_limit is None or self.borrowing_limit >= 0,
            f"borrowingLimit: must be >= 0 or unset, got {self.borrowing_limit}",
        )
        require(
            self.lending_limit is None or 0 <= self.lending_limit <= self.nominal,
            f"lendingLimit: must be between 0 and nominal ({self.nominal}) or unset, "
            f"got {self.lending_limit}",
        )

    @property
    def lendable(self) -> int:
        return self.nominal if self.lending_limit is None else self.lending_limit

    @property
    def guaranteed(self) -> int:
        """Nominal GPUs never lent: only this queue may use them."""
        return self.nominal - self.lendable


NO_QUOTA = ClassQuota(0)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """One queue. ``usage`` is its charged usage in reference-GPU seconds, decayed to the snapshot's
    ``now`` (see `charging`); the caller keeps it between cycles."""

    name: str
    weight: float = 1.0
    cohort: str | None = None
    quotas: Mapping[str, ClassQuota] = field(default_factory=dict)
    usage: float = 0.0

    def __post_init__(self) -> None:
        require(bool(self.name), "queues[].name: must not be empty")
        require(
            math.isfinite(self.weight) and self.weight > 0,
            f"queues[{self.name}].weight: must be a positive number, got {self.weight}",
        )
        require(
            math.isfinite(self.usage) and self.usage >= 0,
            f"queues[{self.name}].usage: must be a finite number >= 0, got {self.usage}",
        )
        require(
            self.cohort is None or bool(self.cohort), f"queues[{self.name}].cohort: empty; leave it unset"
        )
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))

    def quota(self, gpu_class: str) -> ClassQuota:
        return self.quotas.get(gpu_class, NO_QUOTA)

    @classmethod
    def from_spec(cls, name: str, spec: HeteroQueueSpec, usage: float = 0.0) -> QueueInfo:
        """A HeteroQueue as the scheduler sees it (the operator and `heterotrain simulate` both)."""
        quotas = {q.gpu_class: ClassQuota(q.nominal, q.borrowing_limit, q.lending_limit) for q in spec.quotas}
        return cls(name, spec.weight, spec.cohort, quotas, usage)
