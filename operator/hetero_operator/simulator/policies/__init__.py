"""Scheduling policies the simulator compares; each returns the operator's `Decisions`."""

from __future__ import annotations

from collections.abc import Callable

from hetero_operator.simulator.policies.backfill import FifoBackfillPolicy, GreedyFastestPolicy
from hetero_operator.simulator.policies.base import SchedulingPolicy
from hetero_operator.simulator.policies.fifo import FifoGangPolicy
from hetero_operator.simulator.policies.gavel import GavelPolicy
from hetero_operator.simulator.policies.heterotrain import HeterotrainPolicy

POLICIES: dict[str, Callable[[], SchedulingPolicy]] = {
    "fifo": FifoGangPolicy,
    "fifo-backfill": FifoBackfillPolicy,
    "greedy-fastest": GreedyFastestPolicy,
    "gavel": GavelPolicy,
    "heterotrain": HeterotrainPolicy,
}


def make_policy(name: str) -> SchedulingPolicy:
    """A fresh policy (policies may keep state across rounds) by name."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"policy: unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


__all__ = [
    "POLICIES",
    "FifoBackfillPolicy",
    "FifoGangPolicy",
    "GavelPolicy",
    "GreedyFastestPolicy",
    "HeterotrainPolicy",
    "SchedulingPolicy",
    "make_policy",
]
