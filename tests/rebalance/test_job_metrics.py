"""Progress of every running job from two Prometheus queries a tick, and a rebalancer that asks
Prometheus and the API server for more only once a decision is due."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import httpx
from tests.fakekube import FakeKube, ManualClock
from tests.operator.builders import job_body
from tests.rebalance.running_job import current, running_job

from hetero_operator.controller.facts import JobFacts
from hetero_operator.plan import Plan
from hetero_operator.rebalance.job_metrics import (
    JobMetricsPoller,
    JobSample,
    MetricsSnapshot,
    eta_seconds,
    parse_snapshot,
    snapshot_queries,
    worth_writing,
)
from hetero_operator.rebalance.memory import JobMemory
from hetero_operator.rebalance.runner import Rebalancer
from hetero_operator.rebalance.settings import RebalancerSettings
from hetero_operator.resources import Progress

URL = "http://prometheus.invalid"


def vector(rows: list[dict[str, Any]]) -> httpx.Response:
    return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": rows}})


def answers(epochs: dict[tuple[str, str], float], rates: dict[tuple[str, str], float]) -> Any:
    def answer(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        values = epochs if query == snapshot_queries()["epoch"] else rates
        rows = [
            {"metric": {"namespace": ns, "heterotrain_job": job}, "value": [0, str(v)]}
            for (ns, job), v in values.items()
        ]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "vector", "result": rows}}
        )

    return answer


def test_one_query_per_kind_answers_for_every_job() -> None:
    rows = {
        "epoch": [({"namespace": "a", "heterotrain_job": "x"}, 3.0), ({"namespace": "b"}, 1.0)],
        "samples_per_second": [({"namespace": "a", "heterotrain_job": "x"}, 250.0)],
    }
    snapshot = parse_snapshot(rows)
    assert snapshot.jobs == {"a/x": JobSample(3, 250.0)}  # a series without a job label is nobody's
    assert snapshot.of("b/y") == JobSample()


def test_eta_is_the_remaining_epochs_at_the_recent_pace() -> None:
    assert eta_seconds({0: 0.0}, 0, 10) is None  # no whole epoch seen yet
    assert eta_seconds({2: 100.0, 3: 110.0, 4: 130.0}, 4, 10) == 6 * 15.0
    assert eta_seconds({1: 0.0, 3: 50.0}, 3, 10) is None  # not consecutive: the gap is no epoch
    # 5 s into epoch 4 (started at 130 s): 6 epochs of 15 s, less the 5 s already run.
    assert eta_seconds({2: 100.0, 3: 110.0, 4: 130.0}, 4, 10, now=135.0) == 6 * 15.0 - 5


def test_the_eta_counts_down_from_when_it_was_measured() -> None:
    measured = datetime(2026, 1, 1, tzinfo=UTC)
    progress = Progress(epoch=4, eta_seconds=90.0, updated_at=measured)
    assert progress.time_left(measured.timestamp() + 30) == 60.0
    assert progress.time_left(measured.timestamp() + 300) == 0.0  # overdue: nothing left, not negative
    assert Progress(epoch=4, eta_seconds=90.0).time_left(measured.timestamp()) == 90.0  # no time: as written
    assert Progress(epoch=4).time_left(measured.timestamp()) is None


def test_rate_noise_is_not_written_but_a_new_epoch_is() -> None:
    written = Progress(epoch=2, samples_per_second=1000.0)
    assert not worth_writing(written, Progress(epoch=2, samples_per_second=1030.0))
    assert worth_writing(written, Progress(epoch=2, samples_per_second=1060.0))
    assert worth_writing(written, Progress(epoch=3, samples_per_second=1000.0))


def test_progress_is_written_for_running_jobs_whatever_their_rebalancing() -> None:
    async def scenario() -> None:
        kube, clock = FakeKube(), ManualClock()
        for name, enabled in (("on", True), ("off", False)):
            body = job_body(name, rebalance={"enabled": enabled}, epochs=10)
            body["status"] = {"phase": "Running"}
            kube.put(body)
        queued = job_body("waiting")
        queued["status"] = {"phase": "Queued"}
        kube.put(queued)
        jobs = {f.key: f for f in (JobFacts.from_body(b) for b in kube.of_kind("HeteroTrainJob"))}
        epochs = {("team", "on"): 1, ("team", "off"): 1, ("team", "waiting"): 0}
        transport = httpx.MockTransport(answers(epochs, {("team", "on"): 100.0, ("team", "off"): 50.0}))
        async with httpx.AsyncClient(transport=transport) as http:
            poller = JobMetricsPoller(kube, http, URL, clock, tick=2.0)
            poller.sync(jobs)
            await poller.stop()  # the loop's own task is not needed here: one pass by hand
            await poller.poll_once()
            epochs[("team", "on")] = epochs[("team", "off")] = 2
            clock.advance(60)
            await poller.poll_once()
        for name, rate in (("on", 100.0), ("off", 50.0)):
            progress = (kube.obj("HeteroTrainJob", "team", name) or {})["status"]["progress"]
            at = datetime.fromtimestamp(clock.time(), tz=UTC).isoformat().replace("+00:00", "Z")
            expected = {"epoch": 2, "samplesPerSecond": rate, "etaSeconds": 8 * 60.0, "updatedAt": at}
            assert progress == expected
        assert "progress" not in (kube.obj("HeteroTrainJob", "team", "waiting") or {})["status"]
        assert kube.count("PATCH") == 4  # two jobs, two epochs; the queued job is left alone

    asyncio.run(scenario())


def test_a_rebalancer_reads_neither_the_plan_nor_measurements_before_a_decision_is_due() -> None:
    async def scenario() -> None:
        kube, clock = FakeKube(), ManualClock()
        running_job(kube, Plan(version=1, world_size=2, global_batch=64, local_batches=[32, 32]))
        kube.requests.clear()
        asked: list[str] = []

        def prometheus(request: httpx.Request) -> httpx.Response:
            asked.append(request.url.params["query"])
            return httpx.Response(
                200, json={"status": "success", "data": {"resultType": "vector", "result": []}}
            )

        async with httpx.AsyncClient(transport=httpx.MockTransport(prometheus)) as http:
            rebalancer = Rebalancer(kube, http, RebalancerSettings(prometheus_url=URL), clock)
            memory = JobMemory()
            for epoch in (None, 0):  # no metrics yet, then still in the plan's first epoch
                snapshot = MetricsSnapshot(True, {"ns/job": JobSample(epoch)})
                assert await rebalancer.tick(current(kube), memory, snapshot) is None
        assert asked == [] and kube.requests == []

    asyncio.run(scenario())
