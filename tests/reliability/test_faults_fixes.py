"""Operator fixes that the fault tests led to, pinned by unit tests of the pure code involved."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from tests.fakekube import FakeKube, ManualClock
from tests.operator.builders import allocation, job, pod
from tests.rebalance.running_job import metrics_available, running_job, tick

from hetero_operator.controller.lifecycle import LifecycleConfig, Observation, reconcile
from hetero_operator.plan import Plan
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.resources import Condition, ConditionStatus, HeteroTrainJobStatus, Phase

PLAN = Plan(version=2, world_size=2, global_batch=64, local_batches=[32, 32])
OUTAGE = {
    "type": "MetricsAvailable",
    "status": "False",
    "reason": "PrometheusUnavailable",
    "message": "Prometheus at http://prometheus.invalid is unreachable (ConnectError)",
    "lastTransitionTime": "2025-12-31T23:59:59Z",
}


async def _tick(
    kube: FakeKube, prometheus: Any, memory: JobMemory, settings: RebalancerSettings, clock: ManualClock
) -> None:
    async with httpx.AsyncClient(transport=httpx.MockTransport(prometheus)) as http:
        await tick(Rebalancer(kube, http, settings, clock), http, kube, memory)


def test_metrics_available_says_so_as_soon_as_prometheus_answers_again() -> None:
    """After an outage the condition must not keep saying PrometheusUnavailable until the next
    rebalancing decision: once the split has settled, that decision never comes."""
    kube, clock = FakeKube(), ManualClock()
    running_job(kube, PLAN)
    up = {"now": False}

    def prometheus(request: httpx.Request) -> httpx.Response:
        if not up["now"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    memory, settings = JobMemory(), RebalancerSettings(prometheus_url="http://prometheus.invalid")
    asyncio.run(_tick(kube, prometheus, memory, settings, clock))
    down = metrics_available(kube)
    assert down is not None and (down["status"], down["reason"]) == ("False", "PrometheusUnavailable")
    assert memory.prometheus_unreachable, "the rebalancer's task looks again sooner while it is away"
    up["now"] = True
    asyncio.run(_tick(kube, prometheus, memory, settings, clock))
    back = metrics_available(kube)
    assert back is not None and (back["status"], back["reason"]) == ("True", "PrometheusReachable")
    assert not memory.prometheus_unreachable


def _rank_0_unscraped(request: httpx.Request) -> httpx.Response:
    """A Prometheus at epoch 3 of plan version 1 that has series for rank 1 only."""
    query = request.url.params["query"]
    if query.startswith("max by"):
        result = [{"metric": {"namespace": "ns", "heterotrain_job": "job"}, "value": [0, "3"]}]
    elif query.startswith("max(heterotrain_worker_epoch"):
        result = [{"metric": {}, "value": [0, "3"]}]
    elif "heterotrain_worker_step_compute_seconds_sum" in query:
        result = [{"metric": {"rank": "1"}, "value": [0, "0.5"]}]
    else:
        result = []
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


def test_a_pass_that_says_prometheus_is_back_and_then_a_rank_is_missing_stamps_both_transitions() -> None:
    """Prometheus answers again (True), but a rank has not been scraped under this plan yet (False):
    the second write must see the first, or it keeps the outage's transition time and the condition
    reads as if it had never been True."""
    kube, clock = FakeKube(), ManualClock(start=1_767_225_600.0)  # 2026-01-01T00:00:00Z
    running_job(kube, PLAN.model_copy(update={"version": 1}), conditions=[OUTAGE])
    # No grace for the missing rank, so that the pass writes both transitions.
    settings = RebalancerSettings(prometheus_url="http://prometheus.invalid", rediscovery_grace_seconds=0)
    asyncio.run(_tick(kube, _rank_0_unscraped, JobMemory(), settings, clock))
    written = [
        c
        for _, patch in kube.patches
        for c in (patch.get("status") or {}).get("conditions") or []
        if c["type"] == "MetricsAvailable"
    ]
    seen = [(c["status"], c["reason"], c["lastTransitionTime"]) for c in written]
    assert seen == [
        ("True", "PrometheusReachable", "2026-01-01T00:00:00Z"),
        ("False", "InvalidMetrics", "2026-01-01T00:00:00Z"),
    ], seen
    assert "rank(s) [0]" in written[-1]["message"]


def test_a_rank_not_yet_scraped_by_a_prometheus_just_back_is_waited_for_then_reported() -> None:
    """A restarted Prometheus scrapes each worker again only after it has rediscovered the pods: a
    rank without series in those first moments is not a fault; one still without them later is."""
    kube, clock = FakeKube(), ManualClock()
    running_job(kube, PLAN.model_copy(update={"version": 1}))
    memory = JobMemory(prometheus_unreachable=True)  # the last pass found Prometheus down
    settings = RebalancerSettings(prometheus_url="http://prometheus.invalid", rediscovery_grace_seconds=30)
    asyncio.run(_tick(kube, _rank_0_unscraped, memory, settings, clock))
    assert memory.prometheus_back_at is not None and not memory.prometheus_unreachable
    assert metrics_available(kube) is None, "no fault is reported while Prometheus rediscovers the pods"
    clock.advance(31)  # the grace has passed, and rank 0 still has no series
    asyncio.run(_tick(kube, _rank_0_unscraped, memory, settings, clock))
    found = metrics_available(kube)
    assert found is not None and (found["status"], found["reason"]) == ("False", "InvalidMetrics")
    assert "rank(s) [0]" in found["message"]


def _status(phase: Phase, generation: int) -> HeteroTrainJobStatus:
    valid = Condition(
        type="Valid",
        status=ConditionStatus.TRUE,
        reason="Validated",
        message="the spec is valid",
        last_transition_time="2026-01-01T00:00:00Z",
    )
    placed = allocation(("node-a", "fast"), ("node-b", "fast"), generation=generation)
    return HeteroTrainJobStatus(phase=phase, allocation=placed, conditions=[valid])


def test_pods_of_an_earlier_generation_are_deleted_even_when_finished() -> None:
    """An operator killed between a restart's status write and its deletion of the old generation
    used to leave the old, failed pods for good: only live ones counted as stale."""
    old = pod("train-g0-w0", phase="Failed", generation=0, rank=0)
    current = [pod(f"train-g1-w{r}", phase="Running", generation=1, rank=r) for r in (0, 1)]
    running = job(_status(Phase.RUNNING, 1))
    step = reconcile(Observation(running, (old, *current), now=1.0), LifecycleConfig())
    assert step.delete_pods == ("train-g0-w0",)
    done = [pod(f"train-g1-w{r}", phase="Succeeded", generation=1, rank=r) for r in (0, 1)]
    succeeded = job(_status(Phase.SUCCEEDED, 1))
    step = reconcile(Observation(succeeded, (old, *done), now=1.0), LifecycleConfig())
    assert step.delete_pods == ("train-g0-w0",)  # the last generation's pods stay, for their logs
