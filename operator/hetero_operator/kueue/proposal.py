"""The mix a job asks Kueue for: the scheduler's own best placement of the job, on the cluster's
GPU nodes cut down to what the queue's quota can admit.

As the what-if API does, the job alone joins a snapshot of the cluster and one `schedule()` cycle
places it: the GPU set with the best predicted throughput, grown towards gpus.max while that pays.
Here each class offers only as many GPUs as its flavor's quota allows (the nominal quota for a first
proposal, the unused quota for a re-proposal), on its largest nodes, and classes the queue offers
no quota for are not allowed; who else runs on the nodes is left to Kueue, which owns the quota.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from hetero_operator.kueue.workload import ClassShare, ProposedMix, WorkloadSpecError
from hetero_operator.scheduler import JobRequest, NodeInfo, SchedulerConfig, Snapshot, WorkerSlot, schedule


@dataclass(frozen=True, slots=True)
class Proposal:
    """A mix and its predicted throughput, or why there is none."""

    mix: ProposedMix | None
    samples_per_second: float | None = None
    problem: str | None = None


def mix_text(mix: ProposedMix | Mapping[str, int]) -> str:
    """ "fast: 2, slow: 1" (GPUs per class, in the mix's order)."""
    pairs = [(s.gpu_class, s.gpus) for s in mix.shares] if isinstance(mix, ProposedMix) else list(mix.items())
    return ", ".join(f"{gpu_class}: {gpus}" for gpu_class, gpus in pairs)


def capped_nodes(nodes: tuple[NodeInfo, ...], caps: Mapping[str, int]) -> tuple[NodeInfo, ...]:
    """Schedulable nodes of the capped classes, each class offering at most its cap in GPUs, on its
    largest nodes first; the rest of a node counts as used."""
    kept: list[NodeInfo] = []
    left = dict(caps)
    for node in sorted(nodes, key=lambda n: (-n.gpus_allocatable, n.name)):
        room = left.get(node.gpu_class, 0)
        if not node.schedulable or room <= 0 or node.gpus_allocatable <= 0:
            continue
        give = min(node.gpus_allocatable, room)
        left[node.gpu_class] = room - give
        kept.append(replace(node, gpus_used_by_others=node.gpus_allocatable - give, exclusions=()))
    return tuple(sorted(kept, key=lambda n: n.name))


def propose(
    job: JobRequest, cluster: Snapshot, caps: Mapping[str, int], config: SchedulerConfig | None = None
) -> Proposal:
    """The best mix for `job` on `cluster` (its classes and nodes; its jobs are ignored) within
    `caps` (GPUs per class the quota can admit)."""
    classes = {c.name: c for c in cluster.classes}
    wanted = [c for c in job.allowed_classes if c in classes] or sorted(
        classes, key=lambda c: (-classes[c].relative_speed, c)
    )
    offered = tuple(c for c in wanted if caps.get(c, 0) > 0)
    if not offered:
        return Proposal(None, problem="no quota for any of its GPU classes")
    request = replace(job, allowed_classes=offered, current=None, exact_mix=None, created_at=cluster.now)
    snapshot = Snapshot(cluster.classes, capped_nodes(cluster.nodes, caps), (request,), cluster.now)
    decisions = schedule(snapshot, config)
    placed = decisions.place.get(job.key)
    if placed is None:
        limits = ", ".join(f"{c}: {caps.get(c, 0)}" for c in offered)
        waiting = decisions.unschedulable.get(job.key)
        why = f"; {waiting.message}" if waiting is not None else ""
        return Proposal(None, problem=f"no placement fits within the quota ({limits} GPUs){why}")
    try:
        mix = workers_mix(placed.workers)
    except WorkloadSpecError as error:
        return Proposal(None, problem=str(error))
    return Proposal(mix, decisions.predicted_samples_per_second.get(job.key))


def workers_mix(workers: tuple[WorkerSlot, ...]) -> ProposedMix:
    """Workers per class in rank order of their first worker (the fastest class first); every
    worker of a class holds as many GPUs as its first."""
    per_class: Counter[str] = Counter(w.gpu_class for w in workers)
    gpus: dict[str, int] = {}
    for worker in workers:
        gpus.setdefault(worker.gpu_class, worker.gpus)
    return ProposedMix(tuple(ClassShare(c, per_class[c], gpus[c]) for c in gpus))
