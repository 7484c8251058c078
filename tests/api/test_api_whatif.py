"""What-if placement as a pure computation: the operator's scheduler over a given or live snapshot."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from api_cases import job_spec, two_class_pool
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from tests.operator.builders import profile

from hetero_operator.api.models import PoolSpec, WhatIfRequest, WhatIfResult
from hetero_operator.api.whatif import pool_snapshot, unused_key, what_if
from hetero_operator.scheduler import (
    Allocation,
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    Snapshot,
    WorkerSlot,
    schedule,
)


def _request(
    spec: dict[str, object], pool: dict[str, object] | None = None, **fields: object
) -> WhatIfRequest:
    return WhatIfRequest.model_validate({"spec": spec, "pool": pool, **fields})


def _speeds(request: WhatIfRequest) -> dict[str, float]:
    assert request.pool is not None
    return {c.name: c.relative_speed for c in request.pool.classes}


def _run(request: WhatIfRequest) -> WhatIfResult:
    assert request.pool is not None
    return what_if(request, pool_snapshot(request.pool), _speeds(request), "request")


def test_a_small_job_goes_to_the_fast_class_with_a_plan_that_covers_every_worker() -> None:
    result = _run(_request(job_spec(4, classes=["fast", "slow"], global_batch=128), two_class_pool()))
    assert result.schedulable and result.pool == "request"
    assert result.allocation is not None and result.plan is not None
    assert {w.gpu_class for w in result.allocation.workers} == {"fast"}
    assert result.allocation.total_gpus == 4
    assert sum(result.plan.local_batches) == 128 and len(result.plan.local_batches) == 4
    assert result.predicted_samples_per_second is not None and result.predicted_samples_per_second > 0
    assert result.predicted_iteration_seconds == pytest.approx(128 / result.predicted_samples_per_second)
    assert result.plan.predicted_iteration_seconds == pytest.approx(result.predicted_iteration_seconds)


def test_a_job_of_a_measured_workload_is_placed_and_split_as_the_catalog_measured_it() -> None:
    """The priors say slow is a quarter of fast; the workload measured it at half (1 and 2 ms per
    sample): four GPUs of each class are split 2 : 1 per GPU, not 4 : 1. Another workload keeps 4 : 1."""
    catalog = {"digits": profile({"fast": 1.0, "slow": 2.0})}
    pool = two_class_pool(4, 4)
    for workload, per_gpu in (
        ("digits", [100, 100, 100, 100, 50, 50, 50, 50]),
        ("other", [128] * 4 + [32] * 4),
    ):
        request = _request(
            {
                **job_spec(8, 8, classes=["fast", "slow"], global_batch=600 if workload == "digits" else 640),
                "workload": workload,
            },
            pool,
        )
        assert request.pool is not None
        result = what_if(request, pool_snapshot(request.pool), _speeds(request), "request", catalog=catalog)
        assert result.plan is not None and result.plan.local_batches == per_gpu, (workload, result.plan)


def test_the_answer_is_exactly_what_one_scheduler_cycle_decides() -> None:
    """Same snapshot, same cycle: the what-if adds nothing of its own to placement or prediction."""
    request = _request(job_spec(2, 6, classes=["fast", "slow"], global_batch=96), two_class_pool(2, 4, 2))
    result = _run(request)
    assert request.pool is not None
    base = pool_snapshot(request.pool)
    direct = JobRequest(
        key="default/what-if",
        gpus_min=2,
        gpus_max=6,
        global_batch=96,
        created_at=0.0,
        allowed_classes=("fast", "slow"),
    )
    decisions = schedule(Snapshot(base.classes, base.nodes, (direct,), 0.0))
    expected = decisions.place["default/what-if"]
    assert result.allocation is not None
    assert [(w.rank, w.node, w.gpu_class, w.gpus) for w in result.allocation.workers] == [
        (w.rank, w.node, w.gpu_class, w.gpus) for w in expected.workers
    ]
    assert result.predicted_samples_per_second == decisions.predicted_samples_per_second["default/what-if"]


def test_a_job_too_big_for_the_pool_explains_itself_per_class() -> None:
    result = _run(_request(job_spec(12, classes=["slow"]), two_class_pool()))
    assert not result.schedulable
    assert result.allocation is None and result.plan is None
    assert result.reason == "InsufficientCapacity"
    reasons = {r.gpu_class: r.reason for r in result.class_reasons}
    assert set(reasons) == {"fast", "slow"}
    assert reasons["fast"] == "not allowed by spec.gpuClasses"
    assert reasons["slow"].startswith("4 of 12 GPUs free")
    slow = next(r for r in result.class_reasons if r.gpu_class == "slow")
    assert (slow.verdict, slow.free, slow.wanted) == ("NotEnoughFree", 4, 12)
    assert "cannot start until" in result.message


def test_used_gpus_and_unschedulable_nodes_are_not_handed_out() -> None:
    pool = two_class_pool(slow_nodes=2)
    pool["nodes"][0]["gpusUsed"] = 3
    pool["nodes"][1]["schedulable"] = False
    result = _run(_request(job_spec(5, classes=["fast", "slow"]), pool))
    assert result.schedulable and result.allocation is not None
    per_node = Counter(w.node for w in result.allocation.workers)
    assert per_node == {"fast-0": 1, "slow-1": 4}


def test_a_high_priority_job_names_the_running_jobs_it_would_push_aside() -> None:
    request = _request(job_spec(4, classes=["fast"], priority=100), two_class_pool())
    assert request.pool is not None
    empty = pool_snapshot(request.pool)
    running = JobRequest(
        key="team/long-run",
        gpus_min=4,
        gpus_max=4,
        global_batch=64,
        created_at=0.0,
        current=Allocation(tuple(WorkerSlot(rank=i, node="fast-0", gpu_class="fast") for i in range(4))),
    )
    base = Snapshot(empty.classes, empty.nodes, (running,), 10.0)
    result = what_if(request, base, _speeds(request), "live")
    assert not result.schedulable
    assert result.would_preempt == ["team/long-run"]
    assert "making room" in result.message
    # The same job at low priority waits without pushing anyone aside.
    polite = request.model_copy(update={"spec": request.spec.model_copy(update={"priority": -1})})
    assert what_if(polite, base, _speeds(request), "live").would_preempt == []


def test_a_name_taken_by_a_real_job_gets_a_suffix() -> None:
    assert unused_key("ns", "train", set()) == "ns/train"
    assert unused_key("ns", "train", {"ns/train", "ns/train-what-if-1"}) == "ns/train-what-if-2"


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda p: p["nodes"].append({"name": "x", "gpuClass": "nope", "gpus": 1}), "nope"),
        (lambda p: p["nodes"].append({"name": "fast-0", "gpuClass": "fast", "gpus": 1}), "unique"),
        (lambda p: p["nodes"][0].update(gpusUsed=9), "gpusUsed"),
    ],
)
def test_a_bad_pool_is_refused_naming_the_field(change: Callable[[Any], None], complaint: str) -> None:
    pool = two_class_pool()
    change(pool)
    with pytest.raises(ValidationError, match=complaint):
        PoolSpec.model_validate(pool)


@st.composite
def pools_and_jobs(draw: st.DrawFn) -> tuple[dict[str, object], dict[str, object]]:
    speeds = draw(st.lists(st.sampled_from([0.25, 0.5, 1.0, 2.0]), min_size=1, max_size=3))
    classes = [{"name": f"c{i}", "relativeSpeed": s} for i, s in enumerate(speeds)]
    nodes = []
    for index in range(draw(st.integers(1, 6))):
        gpus = draw(st.integers(0, 8))
        nodes.append(
            {
                "name": f"n{index}",
                "gpuClass": f"c{draw(st.integers(0, len(classes) - 1))}",
                "gpus": gpus,
                "gpusUsed": draw(st.integers(0, gpus)),
                "schedulable": draw(st.booleans()),
            }
        )
    gpus_min = draw(st.integers(1, 10))
    gpus_max = gpus_min + draw(st.integers(0, 4))
    names = [f"c{i}" for i in range(len(classes))]
    allowed = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(classes)))
    spec = job_spec(gpus_min, gpus_max, allowed, global_batch=gpus_max * draw(st.integers(1, 32)))
    return {"classes": classes, "nodes": nodes}, spec


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(pools_and_jobs())
def test_any_placement_fits_the_pool_and_the_spec(case: tuple[dict[str, object], dict[str, object]]) -> None:
    pool, spec = case
    request = _request(spec, pool)
    result = _run(request)
    assert result == _run(request), "the same question always gets the same answer"
    assert request.pool is not None
    nodes = {n.name: n for n in request.pool.nodes}
    if not result.schedulable:
        assert result.allocation is None and result.message
        return
    assert result.allocation is not None and result.plan is not None
    assert request.spec.gpus.min <= result.allocation.total_gpus <= request.spec.gpus.max
    used = Counter[str]()
    for worker in result.allocation.workers:
        node = nodes[worker.node]
        assert node.schedulable and worker.gpu_class == node.gpu_class
        assert not request.spec.gpu_classes or worker.gpu_class in request.spec.gpu_classes
        used[worker.node] += worker.gpus
    for name, count in used.items():
        assert count <= nodes[name].gpus - nodes[name].gpus_used
    assert sum(result.plan.local_batches) == request.spec.batch.global_batch


def test_pool_snapshot_keeps_every_node_and_class() -> None:
    spec = PoolSpec.model_validate(two_class_pool(slow_nodes=3))
    snapshot = pool_snapshot(spec)
    assert [c.name for c in snapshot.classes] == ["fast", "slow"]
    assert snapshot.nodes == (
        NodeInfo("fast-0", "fast", 4),
        NodeInfo("slow-0", "slow", 4),
        NodeInfo("slow-1", "slow", 4),
        NodeInfo("slow-2", "slow", 4),
    )
    assert snapshot.classes[1] == GPUClassInfo("slow", 0.25, 16.0, 1.0)
