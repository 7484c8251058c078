"""Heterogeneity-aware placement: mixes, node counts, batch caps, profiles and virtual workers."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_cases import allocation_nodes, job, nodes

from hetero_operator.resources import AllocationPolicy, Strategy
from hetero_operator.scheduler import (
    ClassProfile,
    GPUClassInfo,
    MeasuredProfile,
    NodeInfo,
    PriorModel,
    Snapshot,
    schedule,
)
from hetero_operator.scheduler.free_index import ClassFreeIndex
from hetero_operator.scheduler.throughput import JobShape, predict_data_parallel

Counts = tuple[tuple[str, int], ...]


def _predicted_or_none(snapshot: Snapshot, key: str, counts: Counts, node_count: int) -> float | None:
    request = next(j for j in snapshot.jobs if j.key == key)
    catalog = tuple(sorted(snapshot.classes, key=lambda c: c.name))
    prediction = predict_data_parallel(JobShape.of(request), counts, node_count, catalog, PriorModel())
    return None if prediction is None else prediction.samples_per_second


def _predicted(snapshot: Snapshot, key: str, counts: Counts, node_count: int) -> float:
    value = _predicted_or_none(snapshot, key, counts, node_count)
    assert value is not None
    return value


def test_mixed_classes_chosen_when_predicted_faster_than_any_single_class() -> None:
    classes = (GPUClassInfo("fast", 2.0, 80), GPUClassInfo("slow", 1.0, 16))
    snapshot = Snapshot(classes, (*nodes("fast", 1, 2), *nodes("slow", 1, 8)), (job("a", 4),))
    decisions = schedule(snapshot)
    allocation = decisions.place["ns/a"]
    assert allocation.gpus_per_class() == {"fast": 2, "slow": 2}
    mixed = _predicted(snapshot, "ns/a", (("fast", 2), ("slow", 2)), 2)
    slow_only = _predicted(snapshot, "ns/a", (("slow", 4),), 1)
    assert mixed > slow_only
    assert decisions.predicted_samples_per_second["ns/a"] == mixed


def test_single_class_chosen_when_mixing_is_predicted_slower() -> None:
    # Barely faster GPUs on another node do not pay for cross-node gradient exchange on a small batch.
    classes = (GPUClassInfo("fast", 1.1, 80), GPUClassInfo("slow", 1.0, 16))
    snapshot = Snapshot(
        classes, (*nodes("fast", 1, 2), *nodes("slow", 1, 8)), (job("a", 4, global_batch=32),)
    )
    decisions = schedule(snapshot)
    assert decisions.place["ns/a"].gpus_per_class() == {"slow": 4}
    mixed = _predicted(snapshot, "ns/a", (("fast", 2), ("slow", 2)), 2)
    slow_only = _predicted(snapshot, "ns/a", (("slow", 4),), 1)
    assert slow_only > mixed


def test_single_fast_class_beats_mixing_in_slower_gpus() -> None:
    classes = (GPUClassInfo("fast", 2.0, 80), GPUClassInfo("slow", 1.0, 16))
    snapshot = Snapshot(classes, (*nodes("fast", 1, 4), *nodes("slow", 1, 8)), (job("a", 4),))
    assert schedule(snapshot).place["ns/a"].gpus_per_class() == {"fast": 4}


def test_fewer_nodes_preferred_at_equal_throughput_even_over_class_preference() -> None:
    # Same speed everywhere: class x needs three nodes, class y two; x is the user's first choice.
    classes = (GPUClassInfo("x", 1.0, 16), GPUClassInfo("y", 1.0, 16))
    snapshot = Snapshot(
        classes, (*nodes("x", 3, 2), *nodes("y", 2, 4)), (job("a", 6, allowed_classes=("x", "y")),)
    )
    allocation = schedule(snapshot).place["ns/a"]
    assert allocation.gpus_per_class() == {"y": 6}
    assert len(allocation_nodes(allocation)) == 2


def test_class_preference_breaks_true_ties() -> None:
    classes = (GPUClassInfo("x", 1.0, 16), GPUClassInfo("y", 1.0, 16))
    both = (*nodes("x", 1, 4), *nodes("y", 1, 4))
    for preferred, other in (("x", "y"), ("y", "x")):
        snapshot = Snapshot(classes, both, (job("a", 4, allowed_classes=(preferred, other)),))
        assert schedule(snapshot).place["ns/a"].gpus_per_class() == {preferred: 4}


def test_per_class_batch_cap_rules_out_a_class_that_cannot_hold_the_batch() -> None:
    classes = (GPUClassInfo("fast", 2.0, 16), GPUClassInfo("slow", 1.0, 80))
    snapshot = Snapshot(
        classes,
        (*nodes("fast", 1, 4), *nodes("slow", 1, 4)),
        (job("a", 4, global_batch=64, max_local_batch={"fast": 8}),),
    )
    # Four fast GPUs hold only 4 * 8 = 32 of the 64 samples: that set cannot run the job at all.
    assert _predicted_or_none(snapshot, "ns/a", (("fast", 4),), 1) is None
    assert schedule(snapshot).place["ns/a"].gpus_per_class() == {"slow": 4}


def test_measured_profile_overrides_the_speed_prior() -> None:
    classes = (GPUClassInfo("fast", 2.0, 80), GPUClassInfo("slow", 1.0, 16))
    measured = MeasuredProfile.from_mapping(
        {"fast": ClassProfile(20.0, 10.0, 10.0, 5.0), "slow": ClassProfile(2.0, 10.0, 1.0, 5.0)}, 1.0, 1.0
    )
    infra = (*nodes("fast", 1, 4), *nodes("slow", 1, 4))
    prior_choice = schedule(Snapshot(classes, infra, (job("a", 4),))).place["ns/a"]
    measured_choice = schedule(Snapshot(classes, infra, (job("a", 4, profile=measured),))).place["ns/a"]
    assert prior_choice.gpus_per_class() == {"fast": 4}
    assert measured_choice.gpus_per_class() == {"slow": 4}


def test_hetpipe_node_partition_builds_virtual_workers_inside_nodes() -> None:
    classes = (GPUClassInfo("fast", 2.0, 80), GPUClassInfo("slow", 1.0, 16))
    request = job(
        "p",
        4,
        strategy=Strategy.HETPIPE,
        virtual_worker_size=2,
        allocation_policy=AllocationPolicy.NODE_PARTITION,
    )
    snapshot = Snapshot(classes, (*nodes("fast", 2, 2), *nodes("slow", 1, 4)), (request,))
    allocation = schedule(snapshot).place["ns/p"]
    assert allocation.total_gpus == 4
    by_worker: dict[int, list[tuple[str, int]]] = {}
    for slot in allocation.workers:
        assert slot.virtual_worker is not None and slot.stage is not None
        by_worker.setdefault(slot.virtual_worker, []).append((slot.node, slot.stage))
    assert len(by_worker) == 2
    for members in by_worker.values():
        assert len({node for node, _ in members}) == 1
        assert sorted(stage for _, stage in members) == [0, 1]


def test_hetpipe_gang_is_rounded_up_to_whole_virtual_workers() -> None:
    classes = (GPUClassInfo("slow", 1.0, 16),)
    request = job("p", 3, gpus_max=4, strategy=Strategy.HETPIPE, virtual_worker_size=2)
    allocation = schedule(Snapshot(classes, nodes("slow", 1, 8), (request,))).place["ns/p"]
    assert allocation.total_gpus == 4


def _index(frees: list[int]) -> ClassFreeIndex:
    index = ClassFreeIndex(max(frees, default=0))
    for i, free in enumerate(frees):
        index.add(f"n{i}", free)
    return index


def test_free_index_best_fit_keeps_big_holes_whole() -> None:
    index = _index([8, 4, 2])
    assert index.plan(3) == [("n1", 3)]
    assert index.plan(10) == [("n0", 8), ("n2", 2)]
    assert index.plan(15) is None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=6), st.integers(1, 20))
def test_free_index_plan_uses_the_fewest_nodes(frees: list[int], want: int) -> None:
    picks = _index(frees).plan(want)
    if sum(frees) < want:
        assert picks is None
        return
    assert picks is not None
    assert sum(count for _, count in picks) == want
    for node, count in picks:
        assert 0 < count <= frees[int(node[1:])]
    fewest = min(
        size
        for size in range(1, len(frees) + 1)
        for combo in itertools.combinations(frees, size)
        if sum(combo) >= want
    )
    assert len(picks) == fewest


def test_unschedulable_node_is_never_used() -> None:
    classes = (GPUClassInfo("slow", 1.0, 16),)
    cordoned = NodeInfo("slow-0", "slow", 8, schedulable=False)
    decisions = schedule(
        Snapshot(classes, (cordoned, NodeInfo("slow-1", "slow", 2)), (job("a", 2), job("b", 2)))
    )
    assert allocation_nodes(decisions.place["ns/a"]) == {"slow-1"}
    assert "ns/b" in decisions.unschedulable
