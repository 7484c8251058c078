"""The rebalancer's pure parts: measurement checks, PromQL parsing, and the plan decision."""

from __future__ import annotations

import asyncio
import math
import re

import httpx
import pytest

from hetero_operator import metric_names as names
from hetero_operator.plan import ESyncParams, Plan, SESGDParams, Strategy
from hetero_operator.rebalance import promql
from hetero_operator.rebalance.decide import BatchPolicy, confirm, decide
from hetero_operator.rebalance.history import record, split_balance
from hetero_operator.rebalance.measurements import (
    JobMeasurements,
    MetricsUnavailable,
    NotEnoughSamples,
    WorkerMeasurement,
    check,
)

SPEEDS = (1.0, 0.5, 0.25)
MS_PER_SAMPLE_AT_FULL_SPEED = 2.0
FIXED_MS = 3.0


def simulate(plan: Plan, steps: int = 20, fixed_ms: float = FIXED_MS, host: float = 1.0) -> JobMeasurements:
    """Workers whose compute is linear in their batch and inversely proportional to their speed, on
    a host that runs at `host` times its usual pace (1.1: everything takes 10% longer)."""
    computes = [
        host * (fixed_ms + MS_PER_SAMPLE_AT_FULL_SPEED * b) / speed / 1e3
        for b, speed in zip(plan.local_batches, SPEEDS, strict=True)
    ]
    slowest = max(computes)
    workers = tuple(
        WorkerMeasurement(
            rank=r,
            steps=steps,
            compute_seconds=c,
            sync_start_seconds=0.8 * c,
            comm_seconds=slowest - c + 0.001,
            step_seconds=slowest + 0.001,
        )
        for r, c in enumerate(computes)
    )
    return JobMeasurements(plan_version=plan.version, epoch=plan.apply_at_epoch, workers=workers)


def policy(**overrides: object) -> BatchPolicy:
    base: dict[str, object] = dict(
        base_global_batch=140,
        minimum=70,
        maximum=560,
        adaptive=False,
        min_improvement=0.05,
        per_worker_max=(),
    )
    base.update(overrides)
    return BatchPolicy(**base)  # type: ignore[arg-type]


EVEN = Plan(version=1, world_size=3, global_batch=140, local_batches=[47, 47, 46])


def test_warm_up_goes_inverse_time_then_optperf_and_tracks_the_speeds() -> None:
    history = record({}, simulate(EVEN), EVEN)
    first = decide(EVEN, history, policy(), simulate(EVEN), apply_at_epoch=2)
    assert first.stage == "inverse_time"
    assert first.plan is not None and first.plan.version == 2 and first.plan.apply_at_epoch == 2
    b = first.plan.local_batches
    assert sum(b) == 140 and b[0] > b[1] > b[2]
    assert first.predicted_new_seconds is not None and first.predicted_current_seconds is not None
    assert first.predicted_new_seconds < first.predicted_current_seconds

    history = record(history, simulate(first.plan), first.plan)
    second = decide(first.plan, history, policy(min_improvement=0.0), simulate(first.plan), apply_at_epoch=3)
    assert second.stage == "optperf"
    final = second.plan.local_batches if second.plan else first.plan.local_batches
    # Speeds 1 : 0.5 : 0.25 -> batches close to 4 : 2 : 1 (the fixed cost shifts them a little).
    ratios = (final[0] / final[2], final[1] / final[2])
    assert 3.2 <= ratios[0] <= 4.8 and 1.6 <= ratios[1] <= 2.4


def test_small_predicted_gain_keeps_the_plan() -> None:
    history = record({}, simulate(EVEN), EVEN)
    decision = decide(EVEN, history, policy(min_improvement=10.0), simulate(EVEN), apply_at_epoch=2)
    assert decision.plan is None
    assert "below the threshold" in decision.reason


def test_no_decision_before_every_worker_was_measured() -> None:
    decision = decide(EVEN, {}, policy(), simulate(EVEN), apply_at_epoch=1)
    assert decision.plan is None and decision.stage == "even"


def test_pipelines_keep_their_split() -> None:
    plan = Plan(
        version=1,
        world_size=2,
        global_batch=8,
        local_batches=[8, 0],
        strategy=Strategy.HETPIPE,
        hetpipe={"virtual_workers": [[0, 1]], "stage_boundaries": [[2]]},
    )
    measured = JobMeasurements(
        plan_version=1,
        epoch=1,
        workers=tuple(WorkerMeasurement(r, 10, 0.1, 0.05, 0.01, 0.2) for r in range(2)),
    )
    assert decide(plan, {}, policy(), measured, apply_at_epoch=2).plan is None


def test_esync_keeps_every_workers_batch_equal() -> None:
    """ESync's workers take the same batch by design; a faster one takes more local steps. The same
    uneven speeds that re-split a data plan leave an esync plan as it is."""
    plan = EVEN.model_copy(update={"strategy": Strategy.ESYNC, "esync": ESyncParams()})
    history = record({}, simulate(plan), plan)
    assert decide(EVEN, record({}, simulate(EVEN), EVEN), policy(), simulate(EVEN), 2).plan is not None
    decision = decide(plan, history, policy(), simulate(plan), apply_at_epoch=2)
    assert decision.plan is None and "local steps" in decision.reason


def test_sesgd_plans_keep_their_parameters_when_rebalanced() -> None:
    plan = EVEN.model_copy(update={"strategy": Strategy.SESGD, "sesgd": SESGDParams(groups=3, seed=5)})
    history = record({}, simulate(plan), plan)
    decision = decide(plan, history, policy(), simulate(plan), apply_at_epoch=2)
    assert decision.plan is not None and decision.plan.sesgd == SESGDParams(groups=3, seed=5)
    assert min(decision.plan.local_batches) >= 1


def test_adaptive_total_batch_stays_within_bounds() -> None:
    plan, history = EVEN, {}
    for epoch in range(2, 6):
        # A large fixed cost per step and a large noise scale: bigger total batches pay off.
        measured = simulate(plan, fixed_ms=30.0)
        measured = JobMeasurements(plan.version, epoch, measured.workers, noise_scale=1e6)
        history = record(history, measured, plan)
        decision = decide(plan, history, policy(adaptive=True, min_improvement=0.01), measured, epoch)
        if decision.plan is not None:
            plan = decision.plan
    assert plan.global_batch != 140, "a large noise scale makes a larger total batch worth it"
    assert 70 <= plan.global_batch <= 560
    assert plan.learning_rate_scale == pytest.approx(math.sqrt(plan.global_batch / 140))


def test_history_is_bounded_and_skips_idle_ranks() -> None:
    plan = Plan(version=1, world_size=3, global_batch=10, local_batches=[10, 0, 0])
    history: dict[int, list[object]] = {}
    for _ in range(20):
        history = record(
            history, simulate(Plan(version=1, world_size=3, global_batch=12, local_batches=[4, 4, 4])), plan
        )  # type: ignore[arg-type]
    assert set(history) == {0} and len(history[0]) == 8


@pytest.mark.parametrize(
    ("workers", "staleness", "message"),
    [
        ((WorkerMeasurement(0, 9, 0.1, 0.05, 0.01, 0.2),), None, "rank(s) [1]"),
        (
            (
                WorkerMeasurement(0, 9, math.nan, 0.05, 0.01, 0.2),
                WorkerMeasurement(1, 9, 0.1, 0.05, 0.01, 0.2),
            ),
            None,
            "non-finite compute",
        ),
        (
            (WorkerMeasurement(0, 9, 0.1, -1, 0.01, 0.2), WorkerMeasurement(1, 9, 0.1, 0.05, 0.01, 0.2)),
            None,
            "negative sync start",
        ),
        (
            (WorkerMeasurement(0, 9, 0.1, 0.05, 0.01, 0.2), WorkerMeasurement(1, 9, 0.1, 0.05, 0.01, 0.2)),
            300.0,
            "stale",
        ),
    ],
)
def test_nonsense_metrics_are_refused_with_a_reason(
    workers: tuple[WorkerMeasurement, ...], staleness: float | None, message: str
) -> None:
    measured = JobMeasurements(plan_version=1, epoch=1, workers=workers, seconds_since_last_scrape=staleness)
    with pytest.raises(MetricsUnavailable, match=re.escape(message)):
        check(measured, world_size=2, min_steps=3, max_staleness_seconds=60)


def test_too_few_steps_is_not_a_fault() -> None:
    measured = JobMeasurements(1, 1, tuple(WorkerMeasurement(r, 1, 0.1, 0.05, 0.01, 0.2) for r in range(2)))
    with pytest.raises(NotEnoughSamples):
        check(measured, world_size=2, min_steps=3, max_staleness_seconds=60)


def test_queries_select_the_job_and_plan_version() -> None:
    queries = promql.job_queries("ns1", "digits", 4)
    assert f'{names.LABEL_JOB}="digits"' in queries["compute"]
    assert f'{names.LABEL_PLAN_VERSION}="4"' in queries["compute"]
    assert names.histogram_sum(names.STEP_COMPUTE_SECONDS) in queries["compute"]
    assert f'{names.LABEL_PLAN_VERSION}="4"' not in queries["epoch"]


def _prometheus(handler_values: dict[str, object]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.url.params["query"]
        for needle, body in handler_values.items():
            if needle in query:
                return httpx.Response(200, json=body)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


def _vector(rows: list[tuple[dict[str, str], float]]) -> dict[str, object]:
    return {
        "status": "success",
        "data": {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in rows]},
    }


def test_fetch_parses_per_rank_means() -> None:
    by_rank = _vector([({"rank": "0"}, 0.1), ({"rank": "1"}, 0.4)])
    client = _prometheus(
        {
            names.histogram_sum(names.STEP_COMPUTE_SECONDS): by_rank,
            names.histogram_sum(names.STEP_SECONDS): by_rank,
            f"sum by (rank) ({names.histogram_count(names.STEP_SECONDS)}": _vector(
                [({"rank": "0"}, 12), ({"rank": "1"}, 12)]
            ),
            f"max({names.EPOCH}": _vector([({}, 3)]),
        }
    )
    measured = asyncio.run(promql.fetch(client, "http://prom", "ns", "job", 2))
    assert [w.rank for w in measured.workers] == [0, 1]
    assert measured.workers[1].compute_seconds == pytest.approx(0.4)
    assert measured.workers[0].steps == 12 and measured.epoch == 3


def test_fetch_turns_errors_into_metrics_unavailable() -> None:
    client = _prometheus({"": {"status": "error", "error": "bad query"}})
    with pytest.raises(MetricsUnavailable, match="bad query"):
        asyncio.run(promql.fetch(client, "http://prom", "ns", "job", 1))

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    down = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    with pytest.raises(MetricsUnavailable, match="unreachable"):
        asyncio.run(promql.fetch(down, "http://prom", "ns", "job", 1))


def test_adaptive_total_batch_does_not_grow_without_gradient_noise() -> None:
    plan, history = EVEN, {}
    for epoch in range(2, 6):
        measured = simulate(plan, fixed_ms=30.0)
        measured = JobMeasurements(plan.version, epoch, measured.workers, noise_scale=0.0)
        history = record(history, measured, plan)
        decision = decide(plan, history, policy(adaptive=True, min_improvement=0.01), measured, epoch)
        if decision.plan is not None:
            plan = decision.plan
    assert plan.global_batch <= 140


def test_nearly_equal_batches_are_not_fitted() -> None:
    # Two measurements at 47 and 46 samples: their noise would make any fitted slope meaningless.
    near = Plan(version=2, world_size=3, global_batch=140, local_batches=[46, 47, 47])
    history = record(record({}, simulate(EVEN), EVEN), simulate(near), near)
    decision = decide(near, history, policy(min_improvement=0.0), simulate(near), apply_at_epoch=3)
    assert decision.stage == "inverse_time"


def test_a_model_that_misjudges_the_measured_step_is_not_trusted() -> None:
    history = record({}, simulate(EVEN), EVEN)
    first = decide(EVEN, history, policy(), simulate(EVEN), apply_at_epoch=2)
    assert first.plan is not None
    history = record(history, simulate(first.plan), first.plan)
    honest = simulate(first.plan)
    assert decide(first.plan, history, policy(min_improvement=0.0), honest, 3).stage == "optperf"
    # The same history, but the step just measured took three times what the model explains.
    slow = JobMeasurements(
        honest.plan_version,
        honest.epoch,
        tuple(
            WorkerMeasurement(
                w.rank, w.steps, w.compute_seconds, w.sync_start_seconds, w.comm_seconds, w.step_seconds * 3
            )
            for w in honest.workers
        ),
    )
    assert decide(first.plan, history, policy(min_improvement=0.0), slow, 3).stage == "inverse_time"


def test_a_rebalance_is_kept_undone_or_settled_by_its_measured_balance() -> None:
    balanced = EVEN.model_copy(update={"version": 2, "local_batches": [80, 40, 20]})
    worse = EVEN.model_copy(update={"version": 2, "local_batches": [30, 55, 55]})
    near = EVEN.model_copy(update={"version": 2, "local_batches": [48, 47, 45]})
    # 4 : 2 : 1 for speeds 1 : 0.5 : 0.25 (the fixed cost per step leaves the slowest a little late).
    assert 0.95 < (split_balance(balanced, simulate(balanced)) or 0) < 0.99
    assert (split_balance(EVEN, simulate(EVEN)) or 1) < 0.6
    # Better balanced by a clear margin: keep rebalancing.
    assert confirm(balanced, simulate(balanced), EVEN, simulate(EVEN), 0.05, 4) is None
    # About the same: converged, no new plan.
    same = confirm(near, simulate(near), EVEN, simulate(EVEN), 0.05, 4)
    assert same is not None and same.plan is None and same.stage == "converged"
    # Worse: back to the previous split as a new version.
    back = confirm(worse, simulate(worse), EVEN, simulate(EVEN), 0.05, 4)
    assert back is not None and back.plan is not None
    assert back.plan.version == 3 and back.plan.local_batches == EVEN.local_batches
    assert back.plan.apply_at_epoch == 4 and "balance" in back.reason


def test_a_better_split_is_kept_though_the_host_slowed_down_meanwhile() -> None:
    # The new split would be 2.2x faster on the same host, but the host ran 2.5x slower in its round:
    # its step measured slower than the old one's, its balance did not.
    balanced = EVEN.model_copy(update={"version": 2, "local_batches": [80, 40, 20]})
    slowed, before = simulate(balanced, host=2.5), simulate(EVEN)
    assert max(w.step_seconds for w in slowed.workers) > max(w.step_seconds for w in before.workers)
    assert confirm(balanced, slowed, EVEN, before, 0.05, 4) is None
    # The same split on a host that sped up is still no better balanced: settled, not kept going.
    settled = confirm(balanced, simulate(balanced, host=0.5), balanced, simulate(balanced), 0.05, 4)
    assert settled is not None and settled.plan is None


def test_a_new_total_batch_is_judged_by_samples_per_second() -> None:
    bigger = EVEN.model_copy(update={"version": 2, "global_batch": 280, "local_batches": [160, 80, 40]})
    # Same balance, twice the samples per step for under twice the time: a gain in throughput.
    assert confirm(bigger, simulate(bigger), EVEN, simulate(EVEN), 0.05, 4) is None
    slower = confirm(bigger, simulate(bigger, host=4.0), EVEN, simulate(EVEN), 0.05, 4)
    assert slower is not None and slower.plan is not None and "throughput" in slower.reason


def test_optperf_fits_across_rounds_at_one_pace() -> None:
    # Three rounds; the host ran 15% slower in the second. Lines fitted through raw times would take
    # the slowdown for per-sample cost; brought to one pace, the fit finds the same split as on a
    # steady host.
    def run(hosts: tuple[float, float, float]) -> list[int]:
        plan, history = EVEN, {}
        for epoch, host in enumerate(hosts, start=2):
            measured = simulate(plan, host=host)
            history = record(history, measured, plan)
            decision = decide(plan, history, policy(min_improvement=0.0), measured, epoch)
            if decision.plan is not None:
                plan = decision.plan
        return list(plan.local_batches)

    steady = run((1.0, 1.0, 1.0))
    assert run((1.0, 1.15, 1.0)) == steady
    assert run((1.0, 0.85, 1.0)) == steady


def test_adaptive_total_batch_moves_even_when_the_fitted_model_is_not_trusted() -> None:
    # A fit that misjudges the step falls back to per-sample speeds; the total batch still follows
    # goodput on that model (the measured communication is its fixed cost per step).
    history = record({}, simulate(EVEN, fixed_ms=30.0), EVEN)
    first = decide(EVEN, history, policy(), simulate(EVEN, fixed_ms=30.0), apply_at_epoch=2)
    assert first.plan is not None
    honest = simulate(first.plan, fixed_ms=30.0)
    history = record(history, honest, first.plan)
    slow = JobMeasurements(
        honest.plan_version,
        honest.epoch,
        tuple(
            WorkerMeasurement(
                w.rank,
                w.steps,
                w.compute_seconds,
                w.sync_start_seconds,
                w.comm_seconds + 0.05,
                w.step_seconds * 3,
            )
            for w in honest.workers
        ),
        noise_scale=1e6,
    )
    decision = decide(first.plan, history, policy(adaptive=True, min_improvement=0.01), slow, 3)
    assert decision.stage == "inverse_time"
    assert decision.plan is not None and decision.plan.global_batch > first.plan.global_batch
    assert 70 <= decision.plan.global_batch <= 560
    assert sum(decision.plan.local_batches) == decision.plan.global_batch
