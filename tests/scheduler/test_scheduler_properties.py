"""Properties over random small clusters: what must hold whatever the snapshot."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from scheduler_cases import held_after, small_snapshots

from hetero_operator.scheduler import JobRequest, NodeInfo, SchedulerConfig, Snapshot, schedule
from hetero_operator.scheduler.queueing import scheduling_order

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(small_snapshots())
def test_no_gpu_is_ever_given_twice(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    used: Counter[str] = Counter()
    for per_node in held_after(snapshot, decisions).values():
        used.update(per_node)
    nodes = {n.name: n for n in snapshot.nodes}
    already: Counter[str] = Counter()
    for request in snapshot.jobs:
        if request.current is not None:
            already.update(request.current.gpus_per_node())
    for name, count in used.items():
        node = nodes[name]
        if node.schedulable:
            assert count + node.gpus_used_by_others <= node.gpus_allocatable, name
        else:
            assert count <= already[name], f"new GPUs given on unschedulable node {name}"


@PROPERTY_SETTINGS
@given(small_snapshots())
def test_gangs_are_whole_and_within_bounds(snapshot: Snapshot) -> None:
    decisions = schedule(snapshot)
    jobs = {j.key: j for j in snapshot.jobs}
    for key, allocation in decisions.place.items():
        assert jobs[key].current is None
        assert jobs[key].gpus_min <= allocation.total_gpus <= jobs[key].gpus_max
        assert all(jobs[key].allows(w.gpu_class) for w in allocation.workers)
    for key, resize in [*decisions.grow.items(), *decisions.shrink.items()]:
        assert jobs[key].gpus_min <= resize.allocation.total_gpus <= jobs[key].gpus_max
    queued = {j.key for j in snapshot.jobs if j.current is None}
    assert queued == set(decisions.place) | set(decisions.unschedulable)
    assert not set(decisions.place) & set(decisions.unschedulable)


@PROPERTY_SETTINGS
@given(small_snapshots())
def test_victims_are_preemptible_and_lower_priority_than_a_waiting_job(snapshot: Snapshot) -> None:
    """Only a lower-priority job is preempted or shrunk below its gang size; a job of a waiting job's
    own priority may only give back GPUs it grew into (reclaim_growth, on by default)."""
    decisions = schedule(snapshot)
    jobs = {j.key: j for j in snapshot.jobs}
    waiting_priorities = [jobs[k].priority for k in decisions.unschedulable]
    for key in [*decisions.preempt, *decisions.shrink]:
        victim = jobs[key]
        assert victim.current is not None and victim.preemptible
        if any(p > victim.priority for p in waiting_priorities):
            continue
        assert key in decisions.shrink, f"{key} preempted without a higher-priority job waiting"
        assert any(p == victim.priority for p in waiting_priorities)
        kept = sum(w.gpus for w in decisions.shrink[key].allocation.workers)
        assert kept >= victim.gpus_min, f"{key} shrunk below its gang size for an equal-priority job"


@PROPERTY_SETTINGS
@given(small_snapshots())
def test_same_snapshot_same_decisions_whatever_the_input_order(snapshot: Snapshot) -> None:
    first = schedule(snapshot)
    assert schedule(snapshot) == first
    shuffled = replace(
        snapshot, nodes=snapshot.nodes[::-1], jobs=snapshot.jobs[::-1], classes=snapshot.classes[::-1]
    )
    assert schedule(shuffled) == first


@PROPERTY_SETTINGS
@given(small_snapshots())
def test_backfill_never_delays_the_head_of_any_queue(snapshot: Snapshot) -> None:
    """For every waiting queue head H: whichever holders (running jobs, other workloads) finish
    first, if H could start on the GPUs free before the jobs behind it were placed, it can still
    start after they were (the guarantee of head reservations, which are opt-in)."""
    decisions = schedule(snapshot, SchedulerConfig(head_reservations=True))
    nodes = {n.name: n for n in snapshot.nodes}
    capacity: Counter[str] = Counter()
    free: Counter[str] = Counter()
    held_now: Counter[str] = Counter()
    for request in snapshot.jobs:
        if request.current is not None:
            held_now.update(request.current.gpus_per_node())
    for node in snapshot.nodes:
        if node.schedulable:
            capacity[node.gpu_class] += node.gpus_allocatable
            free[node.gpu_class] += max(
                0, node.gpus_allocatable - node.gpus_used_by_others - held_now[node.name]
            )
    order = scheduling_order(snapshot.jobs)
    placed = {k: a.gpus_per_node() for k, a in decisions.place.items()}
    heads_seen: set[str] = set()
    for position, head in enumerate(order):
        if head.current is not None or head.key in placed or head.queue in heads_seen:
            continue
        allowed = {c for c in capacity if head.allows(c)}
        if sum(capacity[c] for c in allowed) < head.gpus_min:
            continue  # can never start, so it is nobody's head
        heads_seen.add(head.queue)
        before, after = order[:position], order[position + 1 :]
        free_for_head = sum(free[c] for c in allowed) - _gpus_in(
            allowed, [placed.get(j.key) for j in before], nodes
        )
        backfilled = _gpus_in(allowed, [placed.get(j.key) for j in after], nodes)
        holders = [_gpus_in(allowed, [j.current.gpus_per_node()], nodes) for j in snapshot.jobs if j.current]
        holders += [_gpus_in(allowed, [placed[j.key]], nodes) for j in before if j.key in placed]
        holders += [n.gpus_used_by_others for n in snapshot.nodes if n.schedulable and n.gpu_class in allowed]
        for size in range(len(holders) + 1):
            for finished in itertools.combinations(holders, size):
                if free_for_head + sum(finished) >= head.gpus_min:
                    assert free_for_head - backfilled + sum(finished) >= head.gpus_min, (head.key, finished)


def _gpus_in(classes: set[str], allocations: list[Counter[str] | None], nodes: dict[str, NodeInfo]) -> int:
    return sum(
        count
        for per_node in allocations
        if per_node is not None
        for node, count in per_node.items()
        if nodes[node].schedulable and nodes[node].gpu_class in classes
    )


def test_property_strategy_produces_running_and_waiting_jobs() -> None:
    """Guard against a strategy that never exercises contention: some examples must have both."""
    seen = {"running": 0, "waiting": 0}

    @settings(max_examples=40, deadline=None, database=None)
    @given(small_snapshots())
    def observe(snapshot: Snapshot) -> None:
        jobs: tuple[JobRequest, ...] = snapshot.jobs
        if any(j.current is not None for j in jobs):
            seen["running"] += 1
        if schedule(snapshot).unschedulable:
            seen["waiting"] += 1

    observe()
    assert seen["running"] > 5 and seen["waiting"] > 5
