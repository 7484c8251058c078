"""The rebalancer keeps watching a settled split: a worker that slows down later gets a smaller share
within two epochs, and gets its share back once it recovers. Workers and Prometheus are simulated
here (step times from each worker's speed); the expected splits follow from those speeds alone."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import httpx
import pytest
from tests.fakekube import FakeKube, ManualClock
from tests.rebalance.running_job import current, running_job

from hetero_operator import metric_names as names
from hetero_operator.plan import Plan
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.job_metrics import JobSample, MetricsSnapshot
from hetero_operator.rebalance.runner import JobMemory, Rebalancer, RebalancerSettings
from hetero_operator.rebalance.watch import (
    PARTS,
    RankTotals,
    changed_speeds,
    per_sample_seconds,
    window,
)

URL = "http://prometheus.invalid"
MS_PER_SAMPLE = 2.0  # at speed 1
STEPS_PER_EPOCH = 20


class SimulatedWorkers:
    """Three workers that run each epoch under the job's current plan at their current speeds, and
    the Prometheus that scrapes them: cumulative step histograms per plan version and rank."""

    def __init__(self, speeds: list[float]) -> None:
        self.speeds = list(speeds)
        self.epoch = 0
        # (version, rank) -> [seconds per part], [steps per part]
        self.sums: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0] * 4)
        self.counts: dict[tuple[int, int], float] = defaultdict(float)

    def run_epoch(self, plan: Plan) -> None:
        computes = [b * MS_PER_SAMPLE / s / 1e3 for b, s in zip(plan.local_batches, self.speeds, strict=True)]
        step = max(computes) + 0.001
        for rank, compute in enumerate(computes):
            parts = (compute, 0.8 * compute, step - compute, step)
            sums = self.sums[(plan.version, rank)]
            for i, value in enumerate(parts):
                sums[i] += value * STEPS_PER_EPOCH
            self.counts[(plan.version, rank)] += STEPS_PER_EPOCH
        self.epoch += 1

    def answers(self) -> dict[str, list[dict[str, Any]]]:
        """Every query the rebalancer may send, answered from the simulated histograms."""
        out: dict[str, list[dict[str, Any]]] = {}
        versions = sorted({v for v, _ in self.counts})
        for version in versions:
            ranks = sorted(r for v, r in self.counts if v == version)
            totals = promql.totals_queries("ns", "job", version)
            for i, part in enumerate(PARTS):
                out[totals[f"{part}_seconds"]] = [self._row(r, self.sums[(version, r)][i]) for r in ranks]
                out[totals[f"{part}_steps"]] = [self._row(r, self.counts[(version, r)]) for r in ranks]
            means = promql.job_queries("ns", "job", version)
            for i, part in enumerate(PARTS):
                rows = [self._row(r, self.sums[(version, r)][i] / self.counts[(version, r)]) for r in ranks]
                out[means[part]] = rows
            out[means["steps"]] = [self._row(r, self.counts[(version, r)]) for r in ranks]
            out[means["epoch"]] = [{"metric": {}, "value": [0, str(self.epoch)]}]
            out[means["staleness"]] = [{"metric": {}, "value": [0, "1"]}]
        return out

    @staticmethod
    def _row(rank: int, value: float) -> dict[str, Any]:
        return {"metric": {names.LABEL_RANK: str(rank)}, "value": [0, str(value)]}


def proportional(plan: Plan, speeds: list[float]) -> list[float]:
    return [plan.global_batch * s / sum(speeds) for s in speeds]


def test_a_worker_that_slows_down_later_gets_a_smaller_share_and_gets_it_back() -> None:
    async def scenario() -> None:
        kube, clock = FakeKube(), ManualClock()
        workers = SimulatedWorkers([1.0, 0.5, 0.25])
        first = Plan(version=1, world_size=3, global_batch=140, local_batches=[80, 40, 20])  # 4 : 2 : 1

        def prometheus(request: httpx.Request) -> httpx.Response:
            rows = workers.answers().get(request.url.params["query"], [])
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "vector", "result": rows}}
            )

        async with httpx.AsyncClient(transport=httpx.MockTransport(prometheus)) as http:
            rebalancer = Rebalancer(kube, http, RebalancerSettings(prometheus_url=URL), clock)
            memory = JobMemory()
            running_job(kube, first, rebalance={"everyEpochs": 1, "minImprovement": 0.05}, epochs=40)
            plans = {}

            async def epoch(speeds: list[float]) -> None:
                workers.speeds = speeds
                job = current(kube)
                assert job.status is not None and job.status.plan is not None
                plan = memory.plans.get(job.status.plan.version) or first
                workers.run_epoch(plan)
                decision = await rebalancer.tick(
                    job, memory, MetricsSnapshot(True, {"ns/job": JobSample(workers.epoch)})
                )
                if decision is not None and decision.plan is not None:
                    plans[workers.epoch] = decision.plan
                    memory.plans.setdefault(decision.plan.version, decision.plan)

            for _ in range(3):  # settled from the start: nothing to change
                await epoch([1.0, 0.5, 0.25])
            assert plans == {}
            slowed = [0.5, 0.5, 0.25]
            for _ in range(2):
                await epoch(slowed)
            assert plans, "no new split within two epochs of the slowdown"
            newest = plans[max(plans)]
            for got, want in zip(newest.local_batches, proportional(newest, slowed), strict=True):
                assert got == pytest.approx(want, rel=0.15)
            for _ in range(3):  # the new split settles
                await epoch(slowed)
            before_recovery = max(plans)
            for _ in range(3):
                await epoch([1.0, 0.5, 0.25])
            assert max(plans) > before_recovery, "the recovered worker never got its share back"
            newest = plans[max(plans)]
            for got, want in zip(newest.local_batches, proportional(newest, [1.0, 0.5, 0.25]), strict=True):
                assert got == pytest.approx(want, rel=0.15)

    asyncio.run(scenario())


def test_a_window_is_the_difference_of_two_looks() -> None:
    before = {0: RankTotals((1.0, 0.8, 0.2, 1.2), (10, 10, 10, 10))}
    after = {0: RankTotals((3.0, 2.4, 0.6, 3.6), (20, 20, 20, 20))}
    measured = window(before, after, 4, 7)
    assert measured is not None and measured.plan_version == 4 and measured.epoch == 7
    (worker,) = measured.workers
    assert (worker.steps, worker.compute_seconds, worker.step_seconds) == (10, 0.2, pytest.approx(0.24))
    assert window(after, after, 4, 7) is None  # no new step


def test_only_a_clear_change_counts() -> None:
    plan = Plan(version=1, world_size=2, global_batch=30, local_batches=[20, 10])
    assert changed_speeds({0: 0.002, 1: 0.004}, {0: 0.0022, 1: 0.0043}) == {}  # 10% noise
    assert changed_speeds({0: 0.002, 1: 0.004}, {0: 0.004, 1: 0.004}) == {0: 0.5}
    assert changed_speeds({0: 0.004}, {0: 0.002}) == {0: 2.0}
    window_measured = window(
        {0: RankTotals((0, 0, 0, 0), (0, 0, 0, 0)), 1: RankTotals((0, 0, 0, 0), (0, 0, 0, 0))},
        {
            0: RankTotals((0.4, 0, 0, 0.5), (10, 10, 10, 10)),
            1: RankTotals((0.4, 0, 0, 0.5), (10, 10, 10, 10)),
        },
        1,
        2,
    )
    assert window_measured is not None
    assert per_sample_seconds(window_measured, plan) == {0: pytest.approx(0.002), 1: pytest.approx(0.004)}
