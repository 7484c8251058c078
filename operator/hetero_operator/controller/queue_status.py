"""`HeteroQueue` status: GPUs held per class against quota, charged usage and share (pure).

The charged usage lives in the queue's status (``chargedUsage`` as of ``chargedAt``), so it survives
restarts of the operator: each cycle charges it on to now at the rate the queue's jobs hold GPUs,
with the same `charging.accrue` the simulator uses, and the status carries the result forward.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from hetero_operator.controller.facts import QueueFacts
from hetero_operator.resources import ClassUsage, HeteroQueueStatus
from hetero_operator.scheduler import Decisions, GPUClassInfo, JobRequest, NodeInfo, Snapshot
from hetero_operator.scheduler.charging import Charging, accrue, held_rates, share
from hetero_operator.scheduler.queues import QueueInfo


def charged_usage(facts: QueueFacts, rate: float, now: float, charging: Charging) -> float:
    """The queue's usage at ``now``: its recorded usage charged on at ``rate`` since it was recorded."""
    reported = facts.reported
    if reported is None or reported.charged_at is None:
        return 0.0
    return accrue(reported.charged_usage, rate, now - reported.charged_at, charging)


def unknown_classes(facts: QueueFacts, classes: Iterable[str]) -> list[str]:
    known = set(classes)
    return [
        f"spec.quotas[{i}].gpuClass: no GPUClass named {q.gpu_class!r}; create it or fix the name"
        for i, q in enumerate(facts.spec.quotas)
        if q.gpu_class not in known
    ]


def _capacity(nodes: Iterable[NodeInfo]) -> Counter[str]:
    capacity: Counter[str] = Counter()
    for node in nodes:
        capacity[node.gpu_class] += node.gpus_allocatable
    return capacity


def snapshot_queues(
    queues: Mapping[str, QueueFacts],
    jobs: Iterable[JobRequest],
    classes: tuple[GPUClassInfo, ...],
    nodes: tuple[NodeInfo, ...],
    now: float,
    charging: Charging,
) -> tuple[QueueInfo, ...]:
    """The queues as the scheduler sees them; a quota naming no GPUClass is left out (the queue's
    status says so) rather than failing the whole cycle."""
    by_name = {c.name: c for c in classes}
    holding = [(j, j.current.gpus_per_class()) for j in jobs if j.current is not None]
    rates = held_rates(holding, by_name, _capacity(nodes), charging.pricing)
    infos = []
    for name, facts in queues.items():
        spec = facts.spec
        if unknown_classes(facts, by_name):
            spec = spec.model_copy(update={"quotas": [q for q in spec.quotas if q.gpu_class in by_name]})
        usage = charged_usage(facts, rates.get(name, 0.0), now, charging)
        infos.append(QueueInfo.from_spec(name, spec, usage))
    return tuple(infos)


def held_after(snapshot: Snapshot, decisions: Decisions) -> dict[str, Counter[str]]:
    """GPUs per class each job holds once the cycle's decisions are applied (preempted: none)."""
    held = {j.key: j.current.gpus_per_class() for j in snapshot.jobs if j.current is not None}
    for key in decisions.preempt:
        held.pop(key, None)
    for resizes in (decisions.grow, decisions.shrink):
        for key, resize in resizes.items():
            held[key] = resize.allocation.gpus_per_class()
    for key, allocation in decisions.place.items():
        held[key] = allocation.gpus_per_class()
    return held


def desired_statuses(
    snapshot: Snapshot,
    decisions: Decisions,
    queues: Mapping[str, QueueFacts],
    charging: Charging,
) -> dict[str, HeteroQueueStatus]:
    """Every queue's status after this cycle: GPUs held per class against nominal, the usage charged
    up to ``snapshot.now`` and the share the next cycle starts from."""
    held = held_after(snapshot, decisions)
    jobs = {j.key: j for j in snapshot.jobs}
    by_class = {c.name: c for c in snapshot.classes}
    rates = held_rates(
        ((jobs[k], gpus) for k, gpus in held.items()), by_class, _capacity(snapshot.nodes), charging.pricing
    )
    statuses = {}
    for info in snapshot.queues:
        used: Counter[str] = Counter()
        for key, gpus in held.items():
            if jobs[key].queue == info.name:
                used.update(gpus)
        listed = sorted({*info.quotas, *(c for c, n in used.items() if n)})
        usage = [
            ClassUsage(
                gpu_class=c,
                gpus=used[c],
                nominal=info.quota(c).nominal,
                borrowed=max(0, used[c] - info.quota(c).nominal),
            )
            for c in listed
        ]
        mine = [j for j in snapshot.jobs if j.queue == info.name]
        problems = unknown_classes(queues[info.name], by_class) if info.name in queues else []
        statuses[info.name] = HeteroQueueStatus(
            usage=usage,
            summary=" ".join(f"{u.gpu_class} {u.gpus}/{u.nominal}" for u in usage) or None,
            charged_usage=round(info.usage, 3),
            share=round(share(info, rates.get(info.name, 0.0), charging), 6),
            charged_at=snapshot.now,
            running_jobs=sum(1 for j in mine if j.key in held),
            pending_jobs=sum(1 for j in mine if j.key not in held),
            message="; ".join(problems) or None,
        )
    return statuses
