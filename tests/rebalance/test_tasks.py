"""Per-job tasks beside the loop (the rebalancer's, the progress reporter's): one per running job that
wants one, cancelled with it, started again after an error."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tests.operator.builders import job_body

from hetero_operator.controller.clock import SystemClock
from hetero_operator.controller.facts import JobFacts
from hetero_operator.rebalance.tasks import JobPass, JobTaskRunner, running, wants_rebalancer
from hetero_operator.resources import HeteroTrainJob


def facts(name: str, phase: str | None, deleting: bool = False, **spec: Any) -> JobFacts:
    body = job_body(name, **spec)
    if phase is not None:
        body["status"] = {"phase": phase}
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return JobFacts.from_body(body)


def test_only_running_jobs_that_keep_rebalancing_on_want_a_rebalancer() -> None:
    assert wants_rebalancer(facts("a", "Running"))
    assert not wants_rebalancer(facts("b", "Starting"))
    assert not wants_rebalancer(facts("c", None))
    assert not wants_rebalancer(facts("d", "Running", deleting=True))
    assert not wants_rebalancer(facts("e", "Running", rebalance={"enabled": False}))


def counting(passes: list[str]) -> Callable[[str], JobPass]:
    def start(key: str) -> JobPass:
        async def one_pass(job: HeteroTrainJob) -> float:
            passes.append(key)
            return 0.01

        return one_pass

    return start


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_sync_starts_a_task_per_running_job_and_cancels_it_when_the_job_stops() -> None:
    async def scenario() -> None:
        jobs = {f.key: f for f in (facts("a", "Running"), facts("b", "Queued"))}
        passes: list[str] = []
        rebalancers = JobTaskRunner(
            "rebalancer", wants_rebalancer, counting(passes), jobs.get, SystemClock(), first_pause=0.01
        )
        rebalancers.sync(jobs)
        assert rebalancers.running == {"team/a"}
        await _until(lambda: len(passes) >= 3)
        assert set(passes) == {"team/a"}, "only the running job is rebalanced"

        jobs["team/b"] = facts("b", "Running")
        jobs["team/a"] = facts("a", "Succeeded")
        rebalancers.sync(jobs)
        assert rebalancers.running == {"team/b"}
        del jobs["team/b"]
        rebalancers.sync(jobs)
        assert rebalancers.running == frozenset()
        await rebalancers.stop()
        left = [t for t in asyncio.all_tasks() if t.get_name().startswith("rebalancer ")]
        await asyncio.sleep(0)
        assert all(t.done() for t in left)

    asyncio.run(scenario())


def test_a_rebalancer_that_ended_on_an_error_is_started_again_by_the_next_sync() -> None:
    async def scenario() -> None:
        jobs = {f.key: f for f in (facts("a", "Running"),)}
        calls: list[int] = []

        def newest(key: str) -> JobFacts | None:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("index gone wrong")
            return jobs.get(key)

        rebalancers = JobTaskRunner(
            "rebalancer", wants_rebalancer, counting([]), newest, SystemClock(), first_pause=0.01
        )
        rebalancers.sync(jobs)
        first = rebalancers._tasks["team/a"]
        await _until(first.done)
        assert isinstance(first.exception(), RuntimeError)
        rebalancers.sync(jobs)
        assert rebalancers._tasks["team/a"] is not first
        await _until(lambda: len(calls) > 2)  # the new task keeps rebalancing
        await rebalancers.stop()

    asyncio.run(scenario())


def test_progress_is_reported_for_running_jobs_with_rebalancing_off_too() -> None:
    assert running(facts("a", "Running", rebalance={"enabled": False}))
    assert not wants_rebalancer(facts("a", "Running", rebalance={"enabled": False}))
    assert not running(facts("b", "Queued"))
