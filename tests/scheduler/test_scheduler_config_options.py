"""Two scheduler options: reclaiming grown GPUs for an equal-priority head (on by default), and head
reservations (off by default: best-effort FIFO backfill)."""

from __future__ import annotations

from dataclasses import replace

from scheduler_cases import job, nodes

from hetero_operator.scheduler import GPUClassInfo, SchedulerConfig, Snapshot, schedule

ONE_CLASS = (GPUClassInfo("slow", 1.0, 16),)


def _grown_job_and_waiting_head() -> Snapshot:
    # "elastic" grew to all 8 GPUs while the cluster was idle; "head" (same priority) now needs 4.
    placed = schedule(Snapshot(ONE_CLASS, nodes("slow", 1, 8), (job("elastic", 2, gpus_max=8),)))
    grown = placed.place["ns/elastic"]
    assert grown.total_gpus == 8
    running = replace(job("elastic", 2, gpus_max=8), current=grown)
    return Snapshot(ONE_CLASS, nodes("slow", 1, 8), (running, job("head", 4, arrived=5)), now=10)


def test_without_reclaim_growth_an_equal_priority_head_waits_for_grown_gpus() -> None:
    decisions = schedule(_grown_job_and_waiting_head(), SchedulerConfig(reclaim_growth=False))
    assert not decisions.shrink and not decisions.preempt
    assert "ns/head" in decisions.unschedulable


def test_reclaim_growth_shrinks_a_grown_job_toward_its_gang_for_the_head() -> None:
    decisions = schedule(_grown_job_and_waiting_head(), SchedulerConfig(reclaim_growth=True))
    shrunk = decisions.shrink["ns/elastic"].allocation.total_gpus
    assert 2 <= shrunk <= 4  # never below gpus.min; frees at least the head's 4
    assert not decisions.preempt  # equal priority: shrink only, never preempt


def test_reclaim_growth_never_preempts_an_equal_priority_job_at_its_gang_size() -> None:
    running = replace(
        job("steady", 8),
        current=schedule(Snapshot(ONE_CLASS, nodes("slow", 1, 8), (job("steady", 8),))).place["ns/steady"],
    )
    snapshot = Snapshot(ONE_CLASS, nodes("slow", 1, 8), (running, job("head", 4, arrived=5)), now=10)
    decisions = schedule(snapshot, SchedulerConfig(reclaim_growth=True))
    assert not decisions.shrink and not decisions.preempt


def _busy_cluster_with_big_head() -> Snapshot:
    # 4 of 8 GPUs busy; the head needs 8, so by default every free GPU is held back for it.
    first = schedule(
        Snapshot(ONE_CLASS, nodes("slow", 2, 4), (job("busy", 4),)), SchedulerConfig(elastic=False)
    )
    running = replace(job("busy", 4), current=first.place["ns/busy"])
    return Snapshot(
        ONE_CLASS, nodes("slow", 2, 4), (running, job("big", 8, arrived=1), job("small", 1, arrived=2)), now=3
    )


def test_head_reservations_hold_gpus_back_when_on() -> None:
    decisions = schedule(
        _busy_cluster_with_big_head(), SchedulerConfig(elastic=False, head_reservations=True)
    )
    assert "ns/small" not in decisions.place


def test_by_default_later_jobs_backfill_and_grown_gpus_go_back_to_the_head() -> None:
    assert "ns/small" in schedule(_busy_cluster_with_big_head(), SchedulerConfig(elastic=False)).place
    assert schedule(_grown_job_and_waiting_head()).shrink["ns/elastic"].allocation.total_gpus <= 4


def test_without_head_reservations_later_jobs_backfill_free_gpus() -> None:
    config = SchedulerConfig(elastic=False, head_reservations=False)
    decisions = schedule(_busy_cluster_with_big_head(), config)
    assert "ns/small" in decisions.place
    assert "ns/big" in decisions.unschedulable
