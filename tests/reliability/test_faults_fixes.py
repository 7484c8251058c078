"""Operator fixes that the fault tests led to, pinned by unit tests of the pure code involved."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import httpx
import pytest
from tests.operator.builders import allocation, job, pod

from hetero_operator.controller.lifecycle import LifecycleConfig, Observation, reconcile
from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan
from hetero_operator.rebalance import runner
from hetero_operator.rebalance.runner import JobMemory, Rebalancer, RebalancerSettings
from hetero_operator.resources import Condition, ConditionStatus, HeteroTrainJobStatus, Phase


class PlanStore:
    """The rebalancer's Kubernetes side, in memory: one plan ConfigMap, and the status it patches."""

    def __init__(self, plan: Plan) -> None:
        self.config_map = {"data": {PLAN_CONFIGMAP_KEY: plan.to_json()}}
        self.status: dict[str, Any] = {"phase": "Running"}

    async def get(self, path: str, params: Any = None) -> dict[str, Any] | None:
        if "/configmaps/" in path:
            return self.config_map
        return {"metadata": {"resourceVersion": "1"}, "status": self.status}

    async def merge_patch(self, path: str, patch: Any) -> dict[str, Any] | None:
        self.status.update(patch["status"])
        return {}

    async def create_or_replace_data(self, manifest: Any) -> None:
        raise AssertionError("no plan may be written here")

    async def post_event(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_metrics_available_says_so_as_soon_as_prometheus_answers_again() -> None:
    """After an outage the condition must not keep saying PrometheusUnavailable until the next
    rebalancing decision: once the split has settled, that decision never comes."""
    store = PlanStore(Plan(version=2, world_size=2, global_batch=64, local_batches=[32, 32]))
    up = {"now": False}

    def prometheus(request: httpx.Request) -> httpx.Response:
        if not up["now"]:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    memory = JobMemory()

    async def tick() -> dict[str, Any]:
        body = {"metadata": {"namespace": "ns", "name": "job"}, "spec": {}, "status": store.status}
        async with httpx.AsyncClient(transport=httpx.MockTransport(prometheus)) as http:
            rebalancer = Rebalancer(store, http, RebalancerSettings("http://prometheus.invalid"))
            await rebalancer.tick(body, memory)
        return next(c for c in store.status["conditions"] if c["type"] == "MetricsAvailable")

    down = asyncio.run(tick())
    assert (down["status"], down["reason"]) == ("False", "PrometheusUnavailable")
    assert memory.prometheus_unreachable, "the rebalancer's task looks again sooner while it is away"
    up["now"] = True
    back = asyncio.run(tick())
    assert (back["status"], back["reason"]) == ("True", "PrometheusReachable")
    assert not memory.prometheus_unreachable


def _rank_0_unscraped(request: httpx.Request) -> httpx.Response:
    """A Prometheus at epoch 3 of plan version 1 that has series for rank 1 only."""
    query = request.url.params["query"]
    if query.startswith("max(heterotrain_worker_epoch"):
        result = [{"metric": {}, "value": [0, "3"]}]
    elif "heterotrain_worker_step_compute_seconds_sum" in query:
        result = [{"metric": {"rank": "1"}, "value": [0, "0.5"]}]
    else:
        result = []
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": result}})


async def _tick_with_rank_0_unscraped(
    store: PlanStore, settings: RebalancerSettings, memory: JobMemory
) -> None:
    body = {"metadata": {"namespace": "ns", "name": "job"}, "spec": {}, "status": copy.deepcopy(store.status)}
    async with httpx.AsyncClient(transport=httpx.MockTransport(_rank_0_unscraped)) as http:
        await Rebalancer(store, http, settings).tick(body, memory)


def test_a_pass_that_says_prometheus_is_back_and_then_a_rank_is_missing_stamps_both_transitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Prometheus answers again (True), but a rank has not been scraped under this plan yet (False):
    the second write must see the first, or it keeps the outage's transition time and the condition
    reads as if it had never been True."""
    clock = iter(f"2026-01-01T00:00:0{second}Z" for second in range(10))
    monkeypatch.setattr(runner, "_now", lambda: next(clock))
    store = PlanStore(Plan(version=1, world_size=2, global_batch=64, local_batches=[32, 32]))
    store.status["conditions"] = [
        {
            "type": "MetricsAvailable",
            "status": "False",
            "reason": "PrometheusUnavailable",
            "message": "Prometheus at http://prometheus.invalid is unreachable (ConnectError)",
            "lastTransitionTime": "2025-12-31T23:59:59Z",
        }
    ]
    written: list[dict[str, Any]] = []
    merge_patch = store.merge_patch

    async def recording(path: str, patch: Any) -> dict[str, Any] | None:
        written.extend(c for c in patch["status"].get("conditions") or [] if c["type"] == "MetricsAvailable")
        return await merge_patch(path, patch)

    store.merge_patch = recording  # type: ignore[method-assign]

    # The body is the snapshot the pass started from, as a watch event delivers it; no grace for the
    # missing rank, so that the pass writes both transitions.
    settings = RebalancerSettings("http://prometheus.invalid", rediscovery_grace_seconds=0)
    asyncio.run(_tick_with_rank_0_unscraped(store, settings, JobMemory()))
    seen = [(c["status"], c["reason"], c["lastTransitionTime"]) for c in written]
    assert seen == [
        ("True", "PrometheusReachable", "2026-01-01T00:00:00Z"),
        ("False", "InvalidMetrics", "2026-01-01T00:00:01Z"),
    ], seen
    assert "rank(s) [0]" in written[-1]["message"]


def test_a_rank_not_yet_scraped_by_a_prometheus_just_back_is_waited_for_then_reported() -> None:
    """A restarted Prometheus scrapes each worker again only after it has rediscovered the pods: a
    rank without series in those first moments is not a fault; one still without them later is."""
    store = PlanStore(Plan(version=1, world_size=2, global_batch=64, local_batches=[32, 32]))
    memory = JobMemory(prometheus_unreachable=True)  # the last pass found Prometheus down
    settings = RebalancerSettings("http://prometheus.invalid", rediscovery_grace_seconds=30)

    def metrics_available() -> tuple[str, str] | None:
        found = [c for c in store.status.get("conditions") or [] if c["type"] == "MetricsAvailable"]
        return (found[0]["status"], found[0]["reason"]) if found else None

    asyncio.run(_tick_with_rank_0_unscraped(store, settings, memory))
    assert memory.prometheus_back_at is not None and not memory.prometheus_unreachable
    assert metrics_available() is None, "no fault is reported while Prometheus rediscovers the pods"
    memory.prometheus_back_at -= 31  # the grace has passed, and rank 0 still has no series
    asyncio.run(_tick_with_rank_0_unscraped(store, settings, memory))
    assert metrics_available() == ("False", "InvalidMetrics")
    assert "rank(s) [0]" in store.status["conditions"][0]["message"]


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
