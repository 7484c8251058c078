"""The event loop: conservation, determinism, checkpoint costs and invariant checks."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_cases import row, small_trace, three_class_cluster

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import Allocation, Decisions, Snapshot, WorkerSlot
from hetero_operator.scheduler.free_index import ClusterState
from hetero_operator.simulator.cluster import parse_cluster
from hetero_operator.simulator.engine import EngineOptions, SimulationError, simulate
from hetero_operator.simulator.jobs import build_job
from hetero_operator.simulator.policies import POLICIES, FifoGangPolicy, make_policy
from hetero_operator.simulator.policies.base import decisions
from hetero_operator.simulator.rates import best_single_class_rate, best_single_class_set
from hetero_operator.simulator.report import summarize
from hetero_operator.simulator.trace import TraceJob
from hetero_operator.simulator.workloads import RESNET18


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_job_completes_once_no_faster_than_ideal_and_gpu_time_is_conserved(
    policy: str,
) -> None:
    cluster = three_class_cluster()
    trace = small_trace()
    result = simulate(cluster, trace, make_policy(policy))
    assert sorted(o.job_id for o in result.outcomes) == sorted(j.job_id for j in trace)
    makespan = max(o.finish_s or 0.0 for o in result.outcomes)
    for outcome in result.outcomes:
        assert outcome.first_start_s is not None and outcome.first_start_s >= outcome.arrival_s
        assert outcome.jct_s >= outcome.ideal_runtime_s
    # GPU-seconds the jobs held equal GPU-seconds the classes were busy, and never exceed capacity.
    held = sum(o.gpu_seconds for o in result.outcomes)
    assert held == pytest.approx(sum(result.busy_gpu_seconds.values()), rel=1e-9)
    for name, gpus in result.capacity.items():
        assert result.busy_gpu_seconds[name] <= gpus * makespan + 1e-6
    for _, used in result.timeline:
        assert all(0 <= used[c] <= result.capacity[c] for c in used)


def test_same_trace_and_policy_give_identical_results() -> None:
    def run() -> dict[str, object]:
        summary = summarize(simulate(three_class_cluster(), small_trace(seed=9), make_policy("heterotrain")))
        summary.pop("wall_seconds")
        return summary

    assert run() == run()


def test_a_lone_job_finishes_after_start_up_plus_its_work_at_the_predicted_rate() -> None:
    options = EngineOptions(startup_s=45.0)
    result = simulate(
        three_class_cluster(),
        [row("solo", "resnet18", 1, 3600)],
        FifoGangPolicy(),
        options,
    )
    (outcome,) = result.outcomes
    assert outcome.first_start_s == 0.0
    # FIFO puts it on the class with most free GPUs (all equal: the first listed, v100): the
    # reference class, so the run takes its trace duration after the start-up delay.
    assert outcome.finish_s == pytest.approx(45.0 + 3600.0, rel=1e-9)


def test_a_preempted_job_resumes_where_it_stopped_after_its_checkpoint_cost() -> None:
    one_gpu = parse_cluster(
        {
            "classes": [{"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16}],
            "nodeGroups": [{"gpuClass": "v100", "nodes": 1, "gpusPerNode": 1}],
        }
    )
    low = row("low", "resnet18", 1, 1000)
    high = TraceJob(
        job_id="high",
        arrival_s=100,
        model="resnet18",
        gpus_min=1,
        gpus_max=1,
        duration_s=500,
        priority=1,
    )
    options = EngineOptions(startup_s=30.0, cycle_interval_s=30.0)
    result = simulate(one_gpu, [low, high], make_policy("heterotrain"), options)
    outcome = {o.job_id: o for o in result.outcomes}
    # low: starts at 0, makes progress from 30, preempted at 100 (70 s done). high: placed in the
    # next cycle at 130, done at 130 + 30 + 500. low resumes then and pays start-up plus ResNet-18's
    # checkpoint before its remaining 930 s.
    assert outcome["high"].finish_s == pytest.approx(660.0)
    assert outcome["low"].finish_s == pytest.approx(660.0 + 30.0 + RESNET18.checkpoint_s + 930.0)
    assert outcome["low"].restarts == 1 and result.preemptions == 1


@pytest.mark.parametrize("scale", [0.0, 4.0])
def test_the_restart_cost_scale_multiplies_only_what_a_restart_pays(scale: float) -> None:
    one_gpu = parse_cluster(
        {
            "classes": [{"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16}],
            "nodeGroups": [{"gpuClass": "v100", "nodes": 1, "gpusPerNode": 1}],
        }
    )
    low = row("low", "resnet18", 1, 1000)
    high = row("high", "resnet18", 1, 500, arrival_s=100).model_copy(update={"priority": 1})
    options = EngineOptions(startup_s=30.0, cycle_interval_s=30.0, restart_cost_scale=scale)
    outcome = {
        o.job_id: o for o in simulate(one_gpu, [low, high], make_policy("heterotrain"), options).outcomes
    }
    # As above, but low's second start costs scale x (30 s start-up + ResNet-18's checkpoint).
    assert outcome["high"].finish_s == pytest.approx(660.0)
    assert outcome["low"].finish_s == pytest.approx(660.0 + scale * (30.0 + RESNET18.checkpoint_s) + 930.0)


def test_a_negative_restart_cost_scale_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"^restart_cost_scale: must be a finite number >= 0"):
        EngineOptions(restart_cost_scale=-1.0)


@dataclass
class _DoubleBooker:
    name: str = "double-booker"
    pipelines: bool = False
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        node = snapshot.nodes[0]
        place = {
            job.key: Allocation((WorkerSlot(0, node.name, node.gpu_class),))
            for job in snapshot.jobs
            if job.current is None
        }
        return decisions(snapshot, ClusterState(snapshot), place, {}, {})


def test_a_policy_that_double_books_a_gpu_is_stopped() -> None:
    cluster = three_class_cluster(gpus=1)
    trace = [row("a", "resnet18", 1, 600), row("b", "resnet18", 1, 600)]
    with pytest.raises(SimulationError, match="double-booked"):
        simulate(cluster, trace, _DoubleBooker())


def test_jobs_that_can_never_start_are_reported() -> None:
    cluster = three_class_cluster(gpus=2)
    with pytest.raises(SimulationError, match=r"can never start.*big"):
        simulate(cluster, [row("big", "resnet18", 4, 600)], FifoGangPolicy())
    with pytest.raises(SimulationError, match=r"can never start.*big"):
        simulate(cluster, [row("big", "resnet18", 4, 600)], make_policy("gavel"))


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    policy=st.sampled_from(sorted(POLICIES)),
    load=st.sampled_from([0.5, 1.5]),
)
def test_conservation_holds_for_any_small_trace(seed: int, policy: str, load: float) -> None:
    cluster = three_class_cluster(gpus=4)
    trace = small_trace(seed=seed, jobs=12, load=load)
    trace = [
        t.model_copy(update={"gpus_min": min(t.gpus_min, 4), "gpus_max": min(t.gpus_max, 4)}) for t in trace
    ]
    result = simulate(cluster, trace, make_policy(policy))
    assert len(result.outcomes) == len(trace)
    assert all(o.finish_s is not None and o.jct_s >= o.ideal_runtime_s for o in result.outcomes)
    held = sum(o.gpu_seconds for o in result.outcomes)
    assert held == pytest.approx(sum(result.busy_gpu_seconds.values()), rel=1e-9)


@pytest.mark.parametrize("policy", ["fifo-backfill", "greedy-fastest", "heterotrain"])
def test_no_job_on_one_class_finishes_before_its_contention_free_bound(policy: str) -> None:
    """The bound the scheduling benchmark compares policies with: start-up plus the work at the best
    one-class rate a job could have alone. Every run on one class, queued, grown or restarted, is
    slower; an even-split job alone on an empty cluster reaches it."""
    cluster = three_class_cluster()
    trace = [*small_trace(), row("alone", "resnet18", 2, 3600.0, arrival_s=10**7, gpus_max=4)]
    options = EngineOptions()
    catalog = tuple(sorted(cluster.classes, key=lambda c: c.name))
    per_node = {c.name: 8 for c in catalog}
    jobs = {r.job_id: build_job(r, cluster, pipelines=True, prior=options.prior) for r in trace}
    result = simulate(cluster, trace, make_policy(policy), options)
    checked = 0
    for outcome in result.outcomes:
        job = jobs[outcome.job_id]
        if job.request.strategy is not Strategy.DATA or len(outcome.classes_used) != 1:
            continue
        rate = best_single_class_rate(job.request, per_node, catalog, options.prior)
        bound = options.startup_s + job.work_samples / rate
        assert outcome.jct_s >= bound * (1 - 1e-9), outcome.job_id
        checked += 1
        if outcome.job_id == "alone" and policy == "heterotrain":
            assert outcome.jct_s == pytest.approx(bound, rel=1e-6)
    assert checked >= len(trace) // 2


def test_the_bound_names_the_set_that_reaches_it() -> None:
    """V100 is the fastest of the three classes for ResNet-18 (Gavel's table), and on one node more
    GPUs of it train faster: the bound's set is the most V100s the job may have."""
    cluster = three_class_cluster()
    options = EngineOptions()
    catalog = tuple(sorted(cluster.classes, key=lambda c: c.name))
    job = build_job(row("r", "resnet18", 2, 3600.0, gpus_max=4), cluster, pipelines=True, prior=options.prior)
    per_node = {c.name: 8 for c in catalog}
    rate, gpu_class, size = best_single_class_set(job.request, per_node, catalog, options.prior)
    assert (gpu_class, size) == ("v100", 4)
    assert rate == best_single_class_rate(job.request, per_node, catalog, options.prior) > 0
