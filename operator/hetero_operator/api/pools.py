"""Per-GPUClass capacity, computed from the scheduler's snapshot with the scheduler's own bookkeeping;
and the throughput catalog's workloads, as the API lists them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from hetero_operator.api.models import GPUPool, PoolNode, WorkloadSummary
from hetero_operator.controller.catalog import valid_profiles
from hetero_operator.scheduler import Snapshot
from hetero_operator.scheduler.free_index import ClusterState


def pools(snapshot: Snapshot) -> list[GPUPool]:
    """One entry per GPUClass, fastest first; free GPUs are what a new job could be given."""
    state = ClusterState(snapshot)
    held: Counter[str] = Counter()
    for job in snapshot.jobs:
        if job.current is not None:
            held.update(job.current.gpus_per_node())
    by_class: dict[str, list[PoolNode]] = {c.name: [] for c in snapshot.classes}
    for node in sorted(snapshot.nodes, key=lambda n: n.name):
        allocated = min(node.gpus_allocatable, held[node.name] + node.gpus_used_by_others)
        free = state.free[node.gpu_class].free_on(node.name) if node.schedulable else 0
        by_class[node.gpu_class].append(
            PoolNode(
                name=node.name,
                schedulable=node.schedulable,
                gpus_total=node.gpus_allocatable,
                gpus_allocated=allocated,
                gpus_free=free,
            )
        )
    ordered = sorted(snapshot.classes, key=lambda c: (-c.relative_speed, c.name))
    return [
        GPUPool(
            gpu_class=c.name,
            relative_speed=c.relative_speed,
            memoryGiB=c.memory_gib,
            cost_weight=c.cost_weight,
            nodes=by_class[c.name],
            gpus_total=sum(n.gpus_total for n in by_class[c.name]),
            gpus_allocated=sum(n.gpus_allocated for n in by_class[c.name]),
            gpus_free=sum(n.gpus_free for n in by_class[c.name]),
        )
        for c in ordered
    ]


def workload_summaries(bodies: Iterable[Mapping[str, Any]]) -> list[WorkloadSummary]:
    """One entry per valid WorkloadProfile, by workload key."""
    return [
        WorkloadSummary(
            workload=profile.spec.workload,
            throughput=profile.status.throughput if profile.status is not None else [],
            jobs=profile.status.jobs if profile.status is not None else 0,
            updated_at=profile.status.updated_at if profile.status is not None else None,
        )
        for profile in valid_profiles(bodies)
    ]
