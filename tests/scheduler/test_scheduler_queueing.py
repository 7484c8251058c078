"""Queue discipline: priority and arrival order, gang, backfill, preemption and shrinking."""

from __future__ import annotations

import itertools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_cases import job, nodes, run_with_current

from hetero_operator.scheduler import GPUClassInfo, JobRequest, NodeInfo, SchedulerConfig, Snapshot, schedule
from hetero_operator.scheduler.reservations import NO_LIMIT, backfill_allowance, smallest_subset_sum_at_least

SLOW = (GPUClassInfo("slow", 1.0, 16),)
TWO_CLASSES = (GPUClassInfo("a", 1.0, 16), GPUClassInfo("b", 1.0, 16))
NO_GROWTH = SchedulerConfig(elastic=False)
# Head reservations are opt-in: the tests of what they guarantee switch them on.
RESERVING = SchedulerConfig(elastic=False, head_reservations=True)


def _running(snapshot: Snapshot) -> Snapshot:
    return run_with_current(snapshot, NO_GROWTH)


def test_higher_priority_goes_first_even_if_it_arrived_later() -> None:
    snapshot = Snapshot(
        SLOW, nodes("slow", 1, 4), (job("low", 4, arrived=0), job("high", 4, arrived=10, priority=5))
    )
    decisions = schedule(snapshot)
    assert set(decisions.place) == {"ns/high"}
    assert "ns/low" in decisions.unschedulable


def test_equal_priority_is_first_come_first_served_across_queues() -> None:
    jobs = (job("late", 4, arrived=5, queue="q1"), job("early", 4, arrived=1, queue="q2"))
    assert set(schedule(Snapshot(SLOW, nodes("slow", 1, 4), jobs)).place) == {"ns/early"}


def test_gang_gets_all_of_gpus_min_or_nothing() -> None:
    decisions = schedule(Snapshot(SLOW, nodes("slow", 2, 2), (job("big", 6), job("fits", 3))))
    assert "ns/big" not in decisions.place
    assert "needs 6 GPUs at once" in decisions.unschedulable["ns/big"].message
    assert decisions.metrics.gpus_allocated["slow"] == sum(a.total_gpus for a in decisions.place.values())


def test_backfill_uses_a_class_the_waiting_head_cannot_use() -> None:
    running = _running(
        Snapshot(TWO_CLASSES, (*nodes("a", 2, 4), *nodes("b", 1, 2)), (job("r", 4, allowed_classes=("a",)),))
    )
    jobs = (
        *running.jobs,
        job("head", 8, arrived=10, allowed_classes=("a",)),
        job("small", 2, arrived=20, allowed_classes=("a", "b")),
    )
    decisions = schedule(replace(running, jobs=jobs), RESERVING)
    assert "ns/head" in decisions.unschedulable
    assert decisions.place["ns/small"].gpus_per_class() == {"b": 2}


def test_backfill_waits_when_it_would_delay_the_head() -> None:
    running = _running(Snapshot(SLOW, nodes("slow", 2, 4), (job("r", 4),)))
    jobs = (*running.jobs, job("head", 8, arrived=10), job("small", 2, arrived=20))
    decisions = schedule(replace(running, jobs=jobs), RESERVING)
    assert not decisions.place
    assert "held back for ns/head, the head of queue default" in decisions.unschedulable["ns/small"].message
    assert "queued behind ns/head" in decisions.unschedulable["ns/small"].message


def test_backfill_takes_gpus_the_head_could_never_use_anyway() -> None:
    # The head needs 6: 4 are free and the running job's 4 come back all at once, so 2 are spare.
    running = _running(Snapshot(SLOW, nodes("slow", 2, 4), (job("r", 4),)))
    jobs = (*running.jobs, job("head", 6, arrived=10), job("small", 2, arrived=20))
    decisions = schedule(replace(running, jobs=jobs), NO_GROWTH)
    assert set(decisions.place) == {"ns/small"}
    assert "ns/head" in decisions.unschedulable


def test_preemption_stops_a_lower_priority_job_with_a_checkpoint_first() -> None:
    running = _running(Snapshot(SLOW, nodes("slow", 1, 4), (job("low", 4, priority=0),)))
    jobs = (*running.jobs, job("high", 4, arrived=10, priority=3))
    decisions = schedule(replace(running, jobs=jobs))
    assert set(decisions.preempt) == {"ns/low"}
    assert "ns/high" in decisions.preempt["ns/low"].reason
    assert "ns/high" not in decisions.place  # it starts once the victim has let go
    assert "ns/low" in decisions.unschedulable["ns/high"].message
    # Next cycle: the victim is back in the queue and the high-priority job gets its GPUs.
    after = replace(running, jobs=(job("low", 4, priority=0), job("high", 4, arrived=10, priority=3)))
    assert set(schedule(after).place) == {"ns/high"}


def test_equal_priority_and_non_preemptible_jobs_are_never_victims() -> None:
    running = _running(
        Snapshot(SLOW, nodes("slow", 1, 4), (job("peer", 2, priority=3), job("pinned", 2, preemptible=False)))
    )
    jobs = (*running.jobs, job("high", 4, arrived=10, priority=3))
    decisions = schedule(replace(running, jobs=jobs))
    assert not decisions.preempt and not decisions.shrink


def test_no_preemption_when_victims_would_not_free_enough() -> None:
    running = _running(Snapshot(SLOW, nodes("slow", 1, 4), (job("low", 2),)))
    jobs = (
        *running.jobs,
        job("high", 4, arrived=10, priority=3, queue="q2"),
        job("peer", 2, priority=3, queue="q3"),
    )
    running_peer = _running(replace(running, jobs=jobs[:1] + jobs[2:]))
    decisions = schedule(replace(running_peer, jobs=(*running_peer.jobs, jobs[1])))
    assert not decisions.preempt


def test_the_fewest_and_lowest_priority_victims_are_chosen() -> None:
    running = _running(
        Snapshot(
            SLOW,
            nodes("slow", 1, 6),
            (
                job("old", 2, arrived=0, priority=1),
                job("new", 2, arrived=1, priority=1),
                job("lowest", 2, arrived=2),
            ),
        )
    )
    jobs = (*running.jobs, job("high", 2, arrived=10, priority=5))
    decisions = schedule(replace(running, jobs=jobs))
    assert set(decisions.preempt) == {"ns/lowest"}


def test_an_elastic_victim_is_shrunk_rather_than_preempted() -> None:
    elastic = job("elastic", 2, gpus_max=4)
    running = _running(Snapshot(SLOW, nodes("slow", 1, 4), (elastic,)))
    assert running.jobs[0].current is not None and running.jobs[0].current.total_gpus == 2
    grown = replace(
        running.jobs[0], current=schedule(Snapshot(SLOW, nodes("slow", 1, 4), (elastic,))).place["ns/elastic"]
    )
    assert grown.current is not None and grown.current.total_gpus == 4
    decisions = schedule(replace(running, jobs=(grown, job("high", 2, arrived=10, priority=2))))
    assert not decisions.preempt
    shrunk = decisions.shrink["ns/elastic"]
    assert shrunk.allocation.total_gpus == 2


def test_impossible_job_says_so_and_reserves_nothing() -> None:
    decisions = schedule(Snapshot(SLOW, nodes("slow", 1, 4), (job("huge", 16), job("small", 2, arrived=1))))
    assert "cannot start until GPU nodes are added" in decisions.unschedulable["ns/huge"].message
    assert "ns/small" in decisions.place


def _subset_sums(items: list[int]) -> set[int]:
    return {sum(c) for r in range(len(items) + 1) for c in itertools.combinations(items, r)}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=7), st.integers(-3, 40))
def test_smallest_subset_sum_matches_brute_force(items: list[int], target: int) -> None:
    reachable = sorted(s for s in _subset_sums(items) if s >= target)
    assert smallest_subset_sum_at_least(items, target) == (reachable[0] if reachable else None)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 20), st.integers(0, 20), st.lists(st.integers(1, 8), max_size=6))
def test_backfill_allowance_never_delays_any_finish_order(need: int, free: int, holders: list[int]) -> None:
    allowance = backfill_allowance(need, free, holders)
    sums = _subset_sums(holders)
    if allowance == NO_LIMIT:
        assert all(free + s < need for s in sums)
        return
    assert allowance >= 0
    # Taking `allowance` GPUs keeps every finish order that let the head start still sufficient ...
    assert all(free - allowance + s >= need for s in sums if free + s >= need)
    # ... and one more GPU would break one of them.
    assert any(free - allowance - 1 + s < need for s in sums if free + s >= need)


def test_two_queues_each_get_their_own_head() -> None:
    jobs: tuple[JobRequest, ...] = (
        job("q1-head", 8, queue="q1", allowed_classes=("a",)),
        job("q2-head", 8, queue="q2", arrived=1, allowed_classes=("b",)),
        job("q1-next", 1, queue="q1", arrived=2, allowed_classes=("a",)),
    )
    # Half of each node is used by other workloads, which may leave: each head can still start.
    infra = (NodeInfo("a-0", "a", 8, gpus_used_by_others=4), NodeInfo("b-0", "b", 8, gpus_used_by_others=4))
    decisions = schedule(Snapshot(TWO_CLASSES, infra, jobs), RESERVING)
    assert decisions.metrics.queue_length == {"q1": 2, "q2": 1}
    assert "ns/q1-next" not in decisions.place  # class a's 4 free GPUs are all the q1 head can count on
    assert "queued behind ns/q1-head" in decisions.unschedulable["ns/q1-next"].message
    assert "queued behind" not in decisions.unschedulable["ns/q2-head"].message


def test_a_head_waiting_for_gpus_being_handed_back_stops_nobody_else() -> None:
    # Half the node is held by old workers of an earlier victim, still saving a checkpoint.
    def node(releasing: int) -> tuple[NodeInfo, ...]:
        return (NodeInfo("slow-0", "slow", 8, gpus_used_by_others=4, gpus_releasing=releasing),)

    running = _running(Snapshot(SLOW, node(4), (job("low", 4, priority=0),)))
    jobs = (*running.jobs, job("high", 4, arrived=10, priority=3))
    decisions = schedule(replace(running, jobs=jobs))
    assert not decisions.preempt and not decisions.shrink
    assert "ns/high" in decisions.unschedulable
    # The same GPUs held by another workload are not coming back: the low-priority job makes room.
    decisions = schedule(replace(running, nodes=node(0), jobs=jobs))
    assert set(decisions.preempt) == {"ns/low"}
