"""A starting job takes back GPUs that grown jobs hold when it would run much faster on them."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from scheduler_cases import job, nodes

from hetero_operator.scheduler import GPUClassInfo, NodeInfo, SchedulerConfig, Snapshot, schedule
from hetero_operator.scheduler.reasons import WaitCode
from hetero_operator.scheduler.snapshot import Allocation, JobRequest, WorkerSlot

# Per-GPU speeds 4 : 2 : 1; under the prior a set's compute scales with them.
CLASSES = (GPUClassInfo("a100", 4.0, 80), GPUClassInfo("t4", 1.0, 16), GPUClassInfo("v100", 2.0, 32))


def on(gpu_class: str, count: int, node: str | None = None) -> Allocation:
    node = node or f"{gpu_class}-0"
    return Allocation(tuple(WorkerSlot(rank=i, node=node, gpu_class=gpu_class) for i in range(count)))


def grown(key: str = "grown", *, gpus: int = 8, gpu_class: str = "a100", **fields: object) -> JobRequest:
    """A job of gang size 2 that grew to ``gpus`` GPUs of ``gpu_class``."""
    return job(key, 2, gpus_max=8, global_batch=512, current=on(gpu_class, gpus), **fields)


def cluster(*jobs: JobRequest, slow: str = "t4") -> Snapshot:
    return Snapshot(CLASSES, (*nodes("a100", 1, 8), *nodes(slow, 1, 8)), jobs)


def test_a_job_four_times_as_fast_on_lent_gpus_waits_while_the_grown_job_gives_back_just_enough() -> None:
    snapshot = cluster(grown(), job("new", 2, arrived=10))
    decisions = schedule(snapshot)
    assert "ns/new" not in decisions.place
    assert decisions.shrink["ns/grown"].allocation.gpus_per_class() == Counter({"a100": 6})
    assert not decisions.preempt
    waiting = decisions.unschedulable["ns/new"]
    assert waiting.code is WaitCode.RECLAIMING_GROWTH
    assert waiting.faster_on is not None and waiting.faster_on[0] == "a100"
    assert 2.0 <= waiting.faster_on[1] <= 4.0  # per-GPU speeds 4 : 1, the all-reduce the same on both
    assert (
        "waiting for a100 GPUs that jobs grew into while they sat idle, being handed back" in waiting.message
    )
    assert "ns/grown" in waiting.message
    # Once the grown job runs on fewer GPUs, the new job starts on the a100s it gave back.
    shrunk = replace(snapshot.jobs[0], current=decisions.shrink["ns/grown"].allocation)
    after = schedule(replace(snapshot, jobs=(shrunk, snapshot.jobs[1])))
    assert after.place["ns/new"].gpus_per_class() == Counter({"a100": 2})
    assert not after.shrink


def test_a_job_less_than_twice_as_fast_on_lent_gpus_starts_on_what_is_free() -> None:
    decisions = schedule(cluster(grown(), job("new", 2, arrived=10), slow="v100"))
    assert decisions.place["ns/new"].gpus_per_class() == Counter({"v100": 2})
    assert not decisions.shrink


def test_only_what_a_job_grew_into_is_taken_back_and_nobody_is_preempted() -> None:
    # The running job holds its gang size (gpus.min 8): nothing is lent, so the new job starts on t4s.
    rigid = job("rigid", 8, global_batch=512, current=on("a100", 8))
    decisions = schedule(cluster(rigid, job("new", 2, arrived=10)))
    assert decisions.place["ns/new"].gpus_per_class() == Counter({"t4": 2})
    assert not decisions.shrink and not decisions.preempt


def test_higher_priority_and_non_preemptible_jobs_keep_what_they_grew_into() -> None:
    for running in (grown(priority=5), grown(preemptible=False)):
        decisions = schedule(cluster(running, job("new", 2, arrived=10)))
        assert decisions.place["ns/new"].gpus_per_class() == Counter({"t4": 2})
        assert not decisions.shrink


def test_unset_reclaim_gain_starts_the_job_on_what_is_free() -> None:
    decisions = schedule(cluster(grown(), job("new", 2, arrived=10)), SchedulerConfig(reclaim_gain=None))
    assert decisions.place["ns/new"].gpus_per_class() == Counter({"t4": 2})
    assert not decisions.shrink


def test_gpus_still_being_handed_back_keep_the_job_waiting_and_nobody_else_shrinks() -> None:
    # The grown job already runs on its gang size; its old workers still hold 6 a100 GPUs while they
    # save a checkpoint. The newcomer waits for them rather than start on the t4s.
    def with_a100_node(releasing: int) -> Snapshot:
        a100 = NodeInfo("a100-0", "a100", 8, gpus_used_by_others=6, gpus_releasing=releasing)
        jobs = (grown(gpus=2), grown("other", gpu_class="t4", gpus=4), job("new", 2, arrived=10))
        return Snapshot(CLASSES, (a100, *nodes("t4", 1, 8)), jobs)

    decisions = schedule(with_a100_node(releasing=6))
    assert "ns/new" not in decisions.place
    assert decisions.unschedulable["ns/new"].code is WaitCode.RECLAIMING_GROWTH
    assert not decisions.shrink and not decisions.preempt
    # The same 6 GPUs held by another workload are not coming back: it starts on the t4s.
    decisions = schedule(with_a100_node(releasing=0))
    assert decisions.place["ns/new"].gpus_per_class() == Counter({"t4": 2})


def test_gpus_being_handed_back_and_lent_ones_together_make_the_set() -> None:
    # 2 a100 GPUs are still being handed back and a job grew to 6: the newcomer needs 4, so the
    # grown job gives back exactly the 2 the handed-back ones leave missing.
    a100 = NodeInfo("a100-0", "a100", 8, gpus_used_by_others=2, gpus_releasing=2)
    jobs = (grown(gpus=6), job("new", 4, arrived=10))
    decisions = schedule(Snapshot(CLASSES, (a100, *nodes("t4", 1, 8)), jobs))
    assert "ns/new" not in decisions.place
    assert decisions.shrink["ns/grown"].allocation.gpus_per_class() == Counter({"a100": 4})
