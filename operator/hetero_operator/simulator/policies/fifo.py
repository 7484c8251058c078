"""FIFO gang, heterogeneity-unaware: what a queue with GPU types as mere labels does.

Jobs start strictly in priority-then-arrival order with exactly gpus.min GPUs, all of one class:
the allowed class with the most free GPUs (the least-allocated spreading a Kubernetes scheduler does;
speed is not known, ties go to the listed order). The first job that cannot start blocks everyone
behind it (no backfill); nothing is ever resized or preempted.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_operator.scheduler import Allocation, Decisions, Snapshot
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.scheduler.queueing import scheduling_order
from hetero_operator.simulator.policies.base import commit_first_fitting, decisions


@dataclass(slots=True)
class FifoGangPolicy:
    name: str = "fifo"
    pipelines: bool = False
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        state = ClusterState(snapshot)
        class_order = [c.name for c in snapshot.classes]
        place: dict[str, Allocation] = {}
        waiting: dict[str, str] = {}
        blocked_by: str | None = None
        for job in scheduling_order(j for j in snapshot.jobs if j.current is None):
            if blocked_by is not None:
                waiting[job.key] = f"waiting behind {blocked_by} (strict FIFO)"
                continue
            free = state.free_gpus()
            allowed = [c for c in sorted(class_order, key=lambda c: -free[c]) if job.allows(c)]
            allocation = commit_first_fitting(state, job, allowed)
            if allocation is not None:
                place[job.key] = allocation
            else:
                waiting[job.key] = f"no allowed class has {job.gpus_min} free GPUs"
                blocked_by = job.key
        return decisions(snapshot, state, place, waiting, {})
