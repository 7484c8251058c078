"""Which class a job gets: one class unless a mix earns it, near-ties to cheaper GPUs, moves onto
idle faster GPUs, and room for a head made on one class. Expectations follow from the class speeds
(a job's throughput is about the sum of its GPUs' speeds), not from the scheduler's own scores."""

from __future__ import annotations

from dataclasses import replace

from scheduler_cases import job, nodes, run_with_current

from hetero_operator.scheduler import (
    ClassProfile,
    GPUClassInfo,
    MeasuredProfile,
    NodeInfo,
    SchedulerConfig,
    Snapshot,
    schedule,
)

STATIC = SchedulerConfig(elastic=False, move_gain=None)


def test_a_mix_that_barely_beats_one_class_is_not_taken() -> None:
    # 2 free GPUs of "a" (speed 1.0) and 8 of "b" (0.9): 2a + 2b is about 3.8, 4b about 3.6 (5% less):
    # below the 20% a mix must bring, so the job takes four b GPUs and leaves a's for others.
    classes = (GPUClassInfo("a", 1.0, 16), GPUClassInfo("b", 0.9, 16))
    cluster = (NodeInfo("a-0", "a", 4, gpus_used_by_others=2), *nodes("b", 1, 8))
    snapshot = Snapshot(classes, cluster, (job("j", 4),))
    assert schedule(snapshot, STATIC).place["ns/j"].gpus_per_class() == {"b": 4}
    mixing = replace(STATIC, mix_gain=0.0, tie_tolerance=0.0)
    assert schedule(snapshot, mixing).place["ns/j"].gpus_per_class() == {"a": 2, "b": 2}


def test_a_mix_that_is_much_faster_than_one_class_is_taken() -> None:
    # 2a + 2b at speeds 2.0 and 0.5 is about 5, four b GPUs about 2.
    classes = (GPUClassInfo("a", 2.0, 16), GPUClassInfo("b", 0.5, 16))
    cluster = (NodeInfo("a-0", "a", 4, gpus_used_by_others=2), *nodes("b", 1, 8))
    decided = schedule(Snapshot(classes, cluster, (job("j", 4),)), STATIC)
    assert decided.place["ns/j"].gpus_per_class() == {"a": 2, "b": 2}


def test_a_job_waits_for_one_class_unless_no_class_could_ever_hold_it() -> None:
    classes = (GPUClassInfo("a", 1.0, 16), GPUClassInfo("b", 1.0, 16))
    half_busy = (
        NodeInfo("a-0", "a", 4, gpus_used_by_others=2),
        NodeInfo("b-0", "b", 4, gpus_used_by_others=2),
    )
    decided = schedule(Snapshot(classes, half_busy, (job("j", 4),)), STATIC)
    assert "ns/j" in decided.unschedulable and not decided.place
    small_classes = (*nodes("a", 1, 2), *nodes("b", 1, 2))
    decided = schedule(Snapshot(classes, small_classes, (job("j", 4),)), STATIC)
    assert decided.place["ns/j"].gpus_per_class() == {"a": 2, "b": 2}


def test_a_near_tie_goes_to_the_cheaper_class() -> None:
    # "a" is 5% faster than "b" but costs three times as much: within the 10% tie, b wins.
    classes = (GPUClassInfo("a", 1.0, 16, cost_weight=3.0), GPUClassInfo("b", 0.95, 16, cost_weight=1.0))
    snapshot = Snapshot(classes, (*nodes("a", 1, 4), *nodes("b", 1, 4)), (job("j", 1),))
    assert schedule(snapshot, STATIC).place["ns/j"].gpus_per_class() == {"b": 1}
    assert schedule(snapshot, replace(STATIC, tie_tolerance=0.01)).place["ns/j"].gpus_per_class() == {"a": 1}


def test_a_job_listing_classes_keeps_its_preference_in_a_near_tie() -> None:
    classes = (GPUClassInfo("a", 1.0, 16, cost_weight=3.0), GPUClassInfo("b", 0.95, 16, cost_weight=1.0))
    snapshot = Snapshot(
        classes, (*nodes("a", 1, 4), *nodes("b", 1, 4)), (job("j", 1, allowed_classes=("a", "b")),)
    )
    assert schedule(snapshot, STATIC).place["ns/j"].gpus_per_class() == {"a": 1}


def test_while_jobs_wait_on_a_busy_cluster_a_dear_gpu_goes_to_a_job_that_gains_its_price() -> None:
    # "a" is 1 / 0.6 = 1.67x as fast as "b" at three times the cost, and 12 of the 16 GPUs are in use.
    # At scarcity_price 1 a GPU of a costs 3 ** (1 x 12 / 16) = 2.28 times one of b: 1 / 2.28 = 0.44
    # of a's speed per priced GPU against b's 0.6, beyond the 10% tie. With another job waiting both
    # take b; a job alone in the queue, or with no price, takes the fastest GPU, a's.
    classes = (GPUClassInfo("a", 1.0, 16, cost_weight=3.0), GPUClassInfo("b", 0.6, 16, cost_weight=1.0))
    busy = (NodeInfo("a-0", "a", 8, gpus_used_by_others=6), NodeInfo("b-0", "b", 8, gpus_used_by_others=6))
    priced = replace(STATIC, scarcity_price=1.0)
    two_waiting = Snapshot(classes, busy, (job("j", 1), job("k", 1)))
    placed = schedule(two_waiting, priced).place
    assert {key: p.gpus_per_class() for key, p in placed.items()} == {"ns/j": {"b": 1}, "ns/k": {"b": 1}}
    placed = schedule(two_waiting, STATIC).place
    assert {key: p.gpus_per_class() for key, p in placed.items()} == {"ns/j": {"a": 1}, "ns/k": {"a": 1}}
    alone = Snapshot(classes, busy, (job("j", 1),))
    assert schedule(alone, priced).place["ns/j"].gpus_per_class() == {"a": 1}
    # On an idle cluster the price is 3 ** 0 = 1: the fastest GPU, even with jobs waiting.
    idle = Snapshot(classes, (*nodes("a", 1, 8), *nodes("b", 1, 8)), (job("j", 1), job("k", 1)))
    assert schedule(idle, priced).place["ns/j"].gpus_per_class() == {"a": 1}


FAST_SLOW = (GPUClassInfo("fast", 2.0, 16), GPUClassInfo("slow", 0.5, 16))


def _running_on_slow(extra_fast_used: int = 0) -> Snapshot:
    # "fast" is fully taken by others while the job starts, so it lands on "slow"; then fast frees.
    busy = (NodeInfo("fast-0", "fast", 4, gpus_used_by_others=4), *nodes("slow", 1, 4))
    running = run_with_current(Snapshot(FAST_SLOW, busy, (job("r", 2),)), STATIC)
    assert running.jobs[0].current is not None and running.jobs[0].current.gpus_per_class() == {"slow": 2}
    freed = (NodeInfo("fast-0", "fast", 4, gpus_used_by_others=extra_fast_used), *nodes("slow", 1, 4))
    return replace(running, nodes=freed, now=60.0)


def test_a_running_job_moves_onto_idle_faster_gpus() -> None:
    decided = schedule(_running_on_slow(), SchedulerConfig(elastic=False))
    assert decided.grow["ns/r"].allocation.gpus_per_class() == {"fast": 2}  # 4x the speed per GPU
    assert "moved" in decided.grow["ns/r"].reason
    assert not schedule(_running_on_slow(), STATIC).grow  # moves off


def test_a_job_measured_only_where_it_runs_still_moves_onto_idle_faster_gpus() -> None:
    """Measured on "slow" alone, "fast" is estimated from it by the priors (4x): samples/s against
    samples/s, not a measured rate against a prior of 2.0."""
    running = _running_on_slow()
    measured = MeasuredProfile.from_mapping({"slow": ClassProfile(2.0, 10.0, 1.0, 5.0)}, 5.0, 1.0)
    snapshot = replace(running, jobs=(replace(running.jobs[0], profile=measured),))
    decided = schedule(snapshot, SchedulerConfig(elastic=False))
    assert decided.grow["ns/r"].allocation.gpus_per_class() == {"fast": 2}


def test_a_job_about_to_finish_is_not_moved() -> None:
    """4x the speed per GPU saves 3/4 of the time left: 45 s of 60, less than a restart's 60 s."""
    running = _running_on_slow()
    for left, moves in ((60.0, False), (600.0, True)):
        snapshot = replace(running, jobs=(replace(running.jobs[0], remaining_s=left),))
        assert ("ns/r" in schedule(snapshot, SchedulerConfig(elastic=False)).grow) is moves, left


def test_no_move_onto_gpus_a_waiting_job_could_use() -> None:
    snapshot = _running_on_slow(extra_fast_used=2)
    # A fast-only job needing 4 waits for fast's GPUs: they are not idle, so nobody moves there.
    snapshot = replace(snapshot, jobs=(*snapshot.jobs, job("w", 4, arrived=30, allowed_classes=("fast",))))
    decided = schedule(snapshot, SchedulerConfig(elastic=False))
    assert "ns/w" in decided.unschedulable and not decided.grow


def test_no_move_for_a_small_gain() -> None:
    classes = (GPUClassInfo("fast", 0.6, 16), GPUClassInfo("slow", 0.5, 16))
    snapshot = replace(_running_on_slow(), classes=classes)  # 1.2x per GPU: below the 1.5x a move needs
    assert not schedule(snapshot, SchedulerConfig(elastic=False)).grow


def test_a_head_makes_room_on_one_class_not_across_classes() -> None:
    # "a" (fast) holds l1 and l2, "b" holds l3 and has 2 GPUs free. Across classes, preempting one job
    # would give the head 4 GPUs of two classes; on one class it preempts both jobs on "a".
    classes = (GPUClassInfo("a", 2.0, 16), GPUClassInfo("b", 1.0, 16))
    cluster = (*nodes("a", 1, 4), *nodes("b", 1, 4))
    low = (
        job("l1", 2, allowed_classes=("a",)),
        job("l2", 2, arrived=1, allowed_classes=("a",)),
        job("l3", 2, arrived=2, allowed_classes=("b",)),
    )
    running = run_with_current(Snapshot(classes, cluster, low), STATIC)
    head = job("head", 4, arrived=10, priority=5)
    decided = schedule(replace(running, jobs=(*running.jobs, head), now=20), STATIC)
    assert set(decided.preempt) == {"ns/l1", "ns/l2"}
