"""The rebalancer keeps watching a settled split: a worker that slows down later gets a smaller share
within two epochs, and gets its share back once it recovers. Workers and Prometheus are simulated
here (step times from each worker's speed); the expected splits follow from those speeds alone."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from tests.fakekube import FakeKube, ManualClock
from tests.rebalance.running_job import current, running_job

from hetero_operator import metric_names as names
from hetero_operator.plan import Plan
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.job_metrics import JobSample, MetricsSnapshot
from hetero_operator.rebalance.measurements import JobMeasurements, WorkerMeasurement
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.rebalance.watch import (
    PARTS,
    SPEED_CHANGED,
    RankTotals,
    changed_speeds,
    moved_between_splits,
    moved_within,
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

    def run_epoch(self, plan: Plan, steps: int = STEPS_PER_EPOCH, ends: bool = True) -> None:
        """`steps` steps under `plan`; `ends`: the epoch ends with them."""
        computes = [b * MS_PER_SAMPLE / s / 1e3 for b, s in zip(plan.local_batches, self.speeds, strict=True)]
        step = max(computes) + 0.001
        for rank, compute in enumerate(computes):
            parts = (compute, 0.8 * compute, step - compute, step)
            sums = self.sums[(plan.version, rank)]
            for i, value in enumerate(parts):
                sums[i] += value * steps
            self.counts[(plan.version, rank)] += steps
        self.epoch += 1 if ends else 0

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


class WatchedJob:
    """A running job, its simulated workers and Prometheus, and the rebalancer's passes over it."""

    def __init__(self, speeds: list[float], first: Plan, http: httpx.AsyncClient) -> None:
        self.kube, self.workers, self.first = FakeKube(), SimulatedWorkers(speeds), first
        self.rebalancer = Rebalancer(self.kube, http, RebalancerSettings(prometheus_url=URL), ManualClock())
        self.memory = JobMemory()
        self.plans: dict[float, Plan] = {}  # by the (fractional) epoch the plan was written at
        self.steps = 0
        running_job(self.kube, first, rebalance={"everyEpochs": 1, "minImprovement": 0.05}, epochs=40)

    def answer(self, request: httpx.Request) -> httpx.Response:
        rows = self.workers.answers().get(request.url.params["query"], [])
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": rows}}
        )

    async def run(self, speeds: list[float], steps: int = STEPS_PER_EPOCH, prometheus: bool = True) -> None:
        """Run `steps` steps (an epoch's end when the epoch's steps are done), then one pass, which
        finds Prometheus down unless `prometheus`."""
        self.workers.speeds = speeds
        job = current(self.kube)
        assert job.status is not None and job.status.plan is not None
        plan = self.memory.plans.get(job.status.plan.version) or self.first
        self.steps += steps
        self.workers.run_epoch(plan, steps, ends=self.steps % STEPS_PER_EPOCH == 0)
        snapshot = (
            MetricsSnapshot(True, {"ns/job": JobSample(self.workers.epoch)})
            if prometheus
            else MetricsSnapshot(False, error="connection refused")
        )
        decision = await self.rebalancer.tick(job, self.memory, snapshot)
        if decision is not None and decision.plan is not None:
            self.plans[self.steps / STEPS_PER_EPOCH] = decision.plan
            self.memory.plans.setdefault(decision.plan.version, decision.plan)

    def newest(self) -> Plan:
        return self.plans[max(self.plans)]


def served(scenario: Callable[[Callable[[list[float], Plan], WatchedJob]], Awaitable[None]]) -> None:
    """Run `scenario` with a maker of watched jobs whose Prometheus is the simulated one."""

    async def main() -> None:
        jobs: list[WatchedJob] = []

        def prometheus(request: httpx.Request) -> httpx.Response:
            return jobs[-1].answer(request)

        async with httpx.AsyncClient(transport=httpx.MockTransport(prometheus)) as http:

            def make(speeds: list[float], first: Plan) -> WatchedJob:
                jobs.append(WatchedJob(speeds, first, http))
                return jobs[-1]

            await scenario(make)

    asyncio.run(main())


def reasons(job: WatchedJob) -> list[str]:
    """The reasons of the job's rebalances, oldest first, as its status records them."""
    status = current(job.kube).status
    assert status is not None
    return [record.reason for record in status.rebalances]


def assert_proportional(plan: Plan, speeds: list[float]) -> None:
    for got, want in zip(plan.local_batches, proportional(plan, speeds), strict=True):
        assert got == pytest.approx(want, rel=0.15), (plan.local_batches, speeds)


NOMINAL = [1.0, 0.5, 0.25]
SETTLED = Plan(version=1, world_size=3, global_batch=140, local_batches=[80, 40, 20])  # 4 : 2 : 1


def test_a_worker_that_slows_down_later_gets_a_smaller_share_and_gets_it_back() -> None:
    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        job = make(NOMINAL, SETTLED)
        for _ in range(3):  # settled from the start: nothing to change
            await job.run(NOMINAL)
        assert job.plans == {}
        slowed = [0.5, 0.5, 0.25]
        for _ in range(2):
            await job.run(slowed)
        assert job.plans, "no new split within two epochs of the slowdown"
        assert_proportional(job.newest(), slowed)
        for _ in range(3):  # the new split settles
            await job.run(slowed)
        before_recovery = max(job.plans)
        for _ in range(3):
            await job.run(NOMINAL)
        assert max(job.plans) > before_recovery, "the recovered worker never got its share back"
        assert_proportional(job.newest(), NOMINAL)

    served(scenario)


def test_a_change_is_confirmed_by_half_an_epoch_after_the_epoch_that_showed_it() -> None:
    """Passes come every few steps: the epoch that shows a change is followed by a confirming window
    of half its steps, not by a whole second epoch; a window that is still shorter decides nothing."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        job = make(NOMINAL, SETTLED)
        for _ in range(3):
            await job.run(NOMINAL)
        slowed = [0.5, 0.5, 0.25]
        await job.run(slowed)  # the epoch that shows it
        quarter = STEPS_PER_EPOCH // 4
        await job.run(slowed, quarter)
        assert job.plans == {}, "a quarter of an epoch confirmed the change"
        await job.run(slowed, quarter)
        assert list(job.plans) == [4.5], "no new split half an epoch after the epoch that showed it"
        assert_proportional(job.newest(), slowed)

    served(scenario)


def test_a_change_that_began_late_in_an_epoch_is_caught_half_an_epoch_later() -> None:
    """Rank 0 slows down 2x for the last quarter of an epoch: that epoch's mean moves by a fifth of
    a whole change, which makes it suspect; half an epoch at the new speed confirms it."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        job = make(NOMINAL, SETTLED)
        for _ in range(3):
            await job.run(NOMINAL)
        slowed = [0.5, 0.5, 0.25]
        quarter = STEPS_PER_EPOCH // 4
        await job.run(NOMINAL, 3 * quarter)  # a pass mid-epoch: not a look at the split
        await job.run(slowed, quarter)
        await job.run(slowed, 2 * quarter)
        assert list(job.plans) == [4.5], "the change was not caught half an epoch after the epoch it began in"
        assert_proportional(job.newest(), slowed)

    served(scenario)


def test_a_change_that_begins_inside_the_confirming_window_is_sized_on_the_steps_after_it() -> None:
    """An epoch only seemed slower (rank 0 13% slow: suspect, not a change); rank 0 then really slows
    down 2x halfway through the window that would confirm it. That window's mean (0.67x) is no speed
    rank 0 ever ran at: the split is sized on the steps after the window, at 0.5."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        job = make(NOMINAL, SETTLED)
        for _ in range(3):
            await job.run(NOMINAL)
        await job.run([0.87, 0.5, 0.25])  # suspect: the next half epoch confirms it or not
        slowed = [0.5, 0.5, 0.25]
        half_of_confirming = STEPS_PER_EPOCH // 4
        await job.run(NOMINAL, half_of_confirming)
        await job.run(slowed, half_of_confirming)
        assert job.plans == {}, f"a split sized on a window the change began inside: {job.plans}"
        await job.run(slowed, STEPS_PER_EPOCH // 2)
        assert list(job.plans) == [5.0], "no new split on the steps after the window"
        assert_proportional(job.newest(), slowed)
        assert "rank 0 at 0.5x its speed" in reasons(job)[-1]

    served(scenario)


def test_a_step_that_only_seemed_slower_reopens_nothing() -> None:
    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        job = make(NOMINAL, SETTLED)
        for _ in range(3):
            await job.run(NOMINAL)
        await job.run([0.5, 0.5, 0.25])
        for _ in range(4):
            await job.run(NOMINAL, STEPS_PER_EPOCH // 2)
        assert job.plans == {}

    served(scenario)


def test_a_split_gone_back_to_is_reopened_when_a_worker_changed_speed_meanwhile() -> None:
    """Prometheus is down while rank 0 slows down 4x late in the outage: the first split afterwards is
    decided on a round mostly measured before the slowdown, measures worse than the old split's
    (mostly fast) round, and the rebalancer goes back to the old split. That split, measured again,
    shows rank 0 at a quarter of the speed it ran it at: the decision is reopened, and the next split
    follows the new speeds."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        off_balance = Plan(version=1, world_size=3, global_batch=140, local_batches=[70, 40, 30])
        job = make(NOMINAL, off_balance)
        slowed = [0.25, 0.5, 0.25]
        for _ in range(3):
            await job.run(NOMINAL, prometheus=False)
        await job.run(slowed, prometheus=False)
        await job.run(slowed)  # Prometheus is back: a split decided on the mixed round
        assert job.plans[5.0].local_batches[0] < 70, "the first split after the outage kept rank 0's share"
        for _ in range(6):
            await job.run(slowed)
        versions = [p.version for p in job.plans.values()]
        back = [p for p in job.plans.values() if p.local_batches == off_balance.local_batches]
        assert back, f"no rollback to the old split, plans {versions} (the scenario lost its point)"
        assert job.newest().version > back[0].version, "the split gone back to was never reopened"
        assert_proportional(job.newest(), slowed)

    served(scenario)


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


def test_a_window_with_two_speeds_in_it_is_told_by_its_two_parts() -> None:
    plan = Plan(version=1, world_size=1, global_batch=10, local_batches=[10])

    def at(compute_seconds: float, steps: int) -> dict[int, RankTotals]:
        return {0: RankTotals((compute_seconds, 0, 0, compute_seconds), (steps,) * 4)}

    start, midway = at(0.0, 0), at(0.1, 5)  # 2 ms per sample over the first 5 steps
    assert moved_within(start, [midway], at(0.2, 10), plan, 3) == {}  # the same speed throughout
    slowed = at(0.3, 10)  # 4 ms per sample after the fifth step
    assert moved_within(start, [midway], slowed, plan, 3) == {0: pytest.approx(0.5)}
    # Of the looks part-way, the one with the most steps on both sides splits the window: a look
    # after 2 steps alone tells nothing (too few before it), one after 9 neither (too few after it).
    assert moved_within(start, [at(0.04, 2), at(0.26, 9)], slowed, plan, 3) == {}
    assert moved_within(start, [at(0.04, 2), midway, at(0.26, 9)], slowed, plan, 3) == {0: pytest.approx(0.5)}
    assert moved_within(start, [], slowed, plan, 3) == {}  # no look part-way: nothing to tell


def test_a_worker_that_slows_down_as_a_new_split_starts_does_not_freeze_it() -> None:
    """Rank 1 drops to 0.3 of its speed just as the rebalancer's split for the nominal speeds starts.
    That split, so slowed, measures about as balanced as the split before it did at full speed: judged
    against that round it would count as converged, and be watched from its slowed speeds, which
    would never change again. The speeds moved between the two rounds, so the comparison says nothing,
    and the split follows the new speeds."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        off_balance = Plan(version=1, world_size=3, global_batch=140, local_batches=[70, 40, 30])
        job = make(NOMINAL, off_balance)
        await job.run(NOMINAL)
        assert job.plans, "no split for the nominal speeds (the scenario lost its point)"
        assert_proportional(job.newest(), NOMINAL)
        slowed = [1.0, 0.3, 0.25]
        for _ in range(4):
            await job.run(slowed)
        assert_proportional(job.newest(), slowed)
        assert SPEED_CHANGED + ": rank 1 at 0.6x" in reasons(job)[1], reasons(job)

    served(scenario)


def test_a_split_is_not_sized_on_a_round_a_worker_slowed_down_in() -> None:
    """Rank 1 drops to 0.4 of its speed halfway through the round of a new split: that round's mean
    is neither speed's. The rebalancer sees the speed moved and sizes the next split on the steps after
    that round alone, for the new speeds."""

    async def scenario(make: Callable[[list[float], Plan], WatchedJob]) -> None:
        off_balance = Plan(version=1, world_size=3, global_batch=140, local_batches=[70, 40, 30])
        job = make(NOMINAL, off_balance)
        await job.run(NOMINAL)
        assert_proportional(job.newest(), NOMINAL)
        slowed = [1.0, 0.2, 0.25]
        await job.run(NOMINAL)  # the split's round: an epoch at the old speeds
        await job.run(slowed)  # and one at the new: its mean is neither's
        assert len(job.plans) == 1, "a split sized on the round the change happened in"
        await job.run(slowed)
        assert len(job.plans) == 2, "no new split an epoch after the round that showed the change"
        assert_proportional(job.newest(), slowed)
        assert reasons(job)[-1].startswith(SPEED_CHANGED + ": rank 1 at 0.4x"), reasons(job)

    served(scenario)


def rounds(plan: Plan, speeds: list[float], fixed_ms: float = 0.0, host: float = 1.0) -> JobMeasurements:
    """One round's mean computes: a fixed cost per step plus MS_PER_SAMPLE per sample, at `speeds`,
    on a host running at `host` times its usual pace."""
    workers = tuple(
        WorkerMeasurement(rank, 20, host * (fixed_ms + b * MS_PER_SAMPLE) / s / 1e3, 0.0, 0.0, 0.0)
        for rank, (b, s) in enumerate(zip(plan.local_batches, speeds, strict=True))
    )
    return JobMeasurements(plan_version=plan.version, epoch=0, workers=workers)


def test_a_speed_change_between_splits_is_told_from_the_batch_change_and_the_host() -> None:
    even = Plan(version=1, world_size=3, global_batch=120, local_batches=[40, 40, 40])
    shifted = Plan(version=2, world_size=3, global_batch=120, local_batches=[70, 30, 20])
    # A fixed cost as large as 40 samples: rank 2's compute halves with its batch at one third.
    before = rounds(even, NOMINAL, fixed_ms=80.0)
    assert moved_between_splits(even, before, shifted, rounds(shifted, NOMINAL, fixed_ms=80.0)) == {}
    # The whole host at 0.6x its pace moves no rank.
    host = rounds(shifted, NOMINAL, fixed_ms=80.0, host=1 / 0.6)
    assert moved_between_splits(even, before, shifted, host) == {}
    # Rank 1 at a quarter of its speed: slower than its batch and any one host factor explain.
    slowed = rounds(shifted, [1.0, 0.125, 0.25], fixed_ms=80.0)
    assert moved_between_splits(even, before, shifted, slowed) == {1: pytest.approx(320 / 1120)}
    # Rank 0 twice as fast on the same split.
    quicker = rounds(even, [2.0, 0.5, 0.25])
    assert moved_between_splits(even, rounds(even, NOMINAL), even, quicker) == {0: pytest.approx(2.0)}
    # A rank that had no samples in one of the rounds is not compared.
    idle = Plan(version=2, world_size=3, global_batch=120, local_batches=[80, 40, 0])
    assert moved_between_splits(even, rounds(even, NOMINAL), idle, rounds(idle, NOMINAL, fixed_ms=5.0)) == {}
