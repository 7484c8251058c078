"""The cycle as a whole: reasons, elastic growth, metrics and input validation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from scheduler_cases import job, nodes, run_with_current

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import (
    Allocation,
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    SchedulerConfig,
    Snapshot,
    SnapshotError,
    WorkerSlot,
    schedule,
)
from hetero_operator.scheduler.reasons import ClassVerdict, WaitCode

CLASSES = (GPUClassInfo("a100", 2.0, 80), GPUClassInfo("t4", 0.5, 16), GPUClassInfo("v100", 1.0, 32))


def test_unschedulable_reason_names_every_class() -> None:
    infra = (NodeInfo("a-0", "a100", 4, gpus_used_by_others=2), *nodes("t4", 1, 8), *nodes("v100", 1, 1))
    request = job("wait", 4, allowed_classes=("a100", "h100", "v100"))
    waiting = schedule(Snapshot(CLASSES, infra, (request,))).unschedulable["ns/wait"]
    assert waiting.code is WaitCode.WAITING_FOR_GPUS
    assert [(c.gpu_class, c.verdict, c.free) for c in waiting.classes] == [
        ("a100", ClassVerdict.SHORT, 2),
        ("h100", ClassVerdict.UNKNOWN, 0),
        ("v100", ClassVerdict.SHORT, 1),
        ("t4", ClassVerdict.NOT_ALLOWED, 0),
    ]
    reason = waiting.message
    assert reason.startswith("needs 4 GPUs at once (gpus.min)")
    assert "class a100: 2 of 4 GPUs free" in reason
    assert "class h100: no GPUClass of that name" in reason
    assert "class v100: 1 of 4 GPUs free" in reason
    assert "class t4: not allowed by spec.gpuClasses" in reason
    # Preference order first, then the other classes.
    assert reason.index("a100") < reason.index("h100") < reason.index("v100:") < reason.index("t4")


def test_reason_for_a_class_without_schedulable_nodes_and_for_an_impossible_gang() -> None:
    tainted = "taint kwok.x-k8s.io/node=fake:NoSchedule not tolerated"
    infra = (NodeInfo("t4-0", "t4", 8, schedulable=False, exclusions=(tainted,)), *nodes("v100", 1, 2))
    waiting = schedule(Snapshot(CLASSES, infra, (job("big", 4),))).unschedulable["ns/big"]
    assert waiting.code is WaitCode.INSUFFICIENT_CAPACITY and waiting.capacity == 2
    t4 = next(c for c in waiting.classes if c.gpu_class == "t4")
    assert (t4.verdict, t4.nodes, t4.excluded) == (ClassVerdict.NO_SCHEDULABLE_NODES, 1, ((tainted, 1),))
    reason = waiting.message
    assert "class a100: no schedulable nodes (no node matches its nodeSelector)" in reason
    assert f"class t4: no schedulable nodes (1 of 1 node excluded: 1 {tainted}" in reason
    assert "spec.tolerations" in reason
    assert "the allowed classes have 2 schedulable GPUs in total" in reason


def test_reason_when_no_virtual_worker_size_fits_the_gpu_range() -> None:
    request = job("p", 3, strategy=Strategy.HETPIPE, virtual_worker_size=2)  # 3..3 holds no multiple of 2
    waiting = schedule(Snapshot(CLASSES, nodes("v100", 1, 8), (request,))).unschedulable["ns/p"]
    assert waiting.code is WaitCode.NO_VALID_SIZE
    reason = waiting.message
    assert "virtualWorkerSize (2)" in reason and "gpus.min (3)" in reason


def test_idle_gpus_grow_a_new_elastic_job_when_it_pays() -> None:
    decisions = schedule(Snapshot(CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512),)))
    allocation = decisions.place["ns/e"]
    assert allocation.total_gpus > 2
    rigid = schedule(
        Snapshot(CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512),)),
        SchedulerConfig(elastic=False),
    )
    assert rigid.place["ns/e"].total_gpus == 2
    assert decisions.predicted_samples_per_second["ns/e"] > rigid.predicted_samples_per_second["ns/e"]


def test_a_running_job_grows_into_idle_gpus_with_a_checkpoint() -> None:
    start = Snapshot(CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512),))
    running = run_with_current(start, SchedulerConfig(elastic=False))
    decisions = schedule(running)
    resize = decisions.grow["ns/e"]
    assert 2 < resize.allocation.total_gpus <= 8
    assert decisions.metrics.jobs_resized == 1


def test_a_running_job_near_its_end_is_not_restarted_to_grow() -> None:
    """Growing from 2 to at most 8 GPUs saves at most 3/4 of the time left: with 60 s left that is
    45 s, less than the 60 s a restart costs by default; with an hour left it is well worth it."""
    start = Snapshot(CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512),))
    running = run_with_current(start, SchedulerConfig(elastic=False))
    near_end = replace(running, jobs=(replace(running.jobs[0], remaining_s=60.0),))
    assert not schedule(near_end).grow
    assert "ns/e" in schedule(near_end, SchedulerConfig(restart_seconds=None)).grow  # throughput alone
    long_left = replace(running, jobs=(replace(running.jobs[0], remaining_s=3600.0),))
    assert "ns/e" in schedule(long_left).grow


def test_no_growth_into_a_class_someone_waits_for() -> None:
    start = Snapshot(CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512),))
    running = run_with_current(start, SchedulerConfig(elastic=False))
    other = NodeInfo("v100-busy", "v100", 8, gpus_used_by_others=8)
    waiting = replace(running, nodes=(*running.nodes, other), jobs=(*running.jobs, job("w", 8, arrived=5)))
    decisions = schedule(waiting)
    assert not decisions.grow
    assert "ns/w" in decisions.unschedulable


def test_jobs_already_at_their_cap_do_not_use_up_the_growth_budget() -> None:
    # One growth try per cycle: the older job cannot grow (gpus.max = gpus.min), so the try goes to
    # the younger, elastic one.
    jobs = (job("rigid", 2, arrived=0), job("e", 2, arrived=1, gpus_max=8, global_batch=512))
    running = run_with_current(Snapshot(CLASSES, nodes("v100", 1, 12), jobs), SchedulerConfig(elastic=False))
    decisions = schedule(running, SchedulerConfig(max_growths_per_cycle=1))
    assert set(decisions.grow) == {"ns/e"}


def test_growth_skips_non_preemptible_running_jobs() -> None:
    start = Snapshot(
        CLASSES, nodes("v100", 1, 8), (job("e", 2, gpus_max=8, global_batch=512, preemptible=False),)
    )
    assert not schedule(run_with_current(start, SchedulerConfig(elastic=False))).grow


def test_metrics_count_queues_and_gpus() -> None:
    jobs = (job("a", 4, queue="q1"), job("b", 8, queue="q1", arrived=1), job("c", 8, queue="q2", arrived=2))
    decisions = schedule(Snapshot(CLASSES, nodes("v100", 1, 8), jobs), SchedulerConfig(elastic=False))
    metrics = decisions.metrics
    assert metrics.queue_length == {"q1": 1, "q2": 1}
    assert metrics.gpus_allocated == {"a100": 0, "t4": 0, "v100": 4}
    assert metrics.gpus_free == {"a100": 0, "t4": 0, "v100": 4}
    assert metrics.jobs_placed == 1


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: job("x", 0), "gpus_min: must be >= 1"),
        (lambda: job("x", 4, gpus_max=2), "gpus_max: must be >= gpus_min"),
        (lambda: JobRequest("no-namespace", 1, 1, 8, 0.0), "must be 'namespace/name'"),
        (lambda: job("x", 4, global_batch=2), "global_batch: must be >= gpus_min"),
        (lambda: job("x", 2, allowed_classes=("a", "a")), "allowed_classes: must not repeat"),
        (lambda: job("x", 2, max_local_batch={"a100": 0}), "max_local_batch: limits must be >= 1"),
        (lambda: job("x", 2, remaining_s=-5.0), "remaining_s: must be a finite number of seconds >= 0"),
        (lambda: GPUClassInfo("a", 0.0, 1.0), "relative_speed: must be a positive number"),
        (lambda: NodeInfo("n", "a", 4, gpus_used_by_others=-1), "gpus_used_by_others: must be >= 0"),
        (
            lambda: Snapshot(CLASSES, (NodeInfo("n", "h100", 4),), ()),
            "nodes[n].gpu_class: 'h100' is not a GPUClass",
        ),
        (lambda: Snapshot(CLASSES, (), (job("x", 1), job("x", 1))), "jobs[].key: must be unique"),
        (
            lambda: Snapshot(
                CLASSES, (), (job("x", 1, current=Allocation((WorkerSlot(0, "gone", "v100"),))),)
            ),
            "re-queue the job (current=None)",
        ),
        (lambda: Allocation((WorkerSlot(1, "n", "v100"),)), "ranks must be 0..n-1"),
    ],
)
def test_bad_input_is_rejected_with_the_field_and_the_fix(build: object, fragment: str) -> None:
    with pytest.raises(SnapshotError, match=None) as caught:
        build()  # type: ignore[operator]
    assert fragment in str(caught.value)
