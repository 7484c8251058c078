"""The lower bound on average JCT: below every schedule, above isolation, and binding when capacity is."""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
import typer
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sim_cases import capacity, row, three_class_cluster
from typer.testing import CliRunner

from hetero_operator.cli.simulate import simulate as simulate_command
from hetero_operator.resources import Strategy
from hetero_operator.scheduler import Allocation, GPUClassInfo, WorkerSlot
from hetero_operator.simulator.cluster import Cluster, load_cluster, parse_cluster
from hetero_operator.simulator.engine import EngineOptions
from hetero_operator.simulator.jobs import JobSetupError, SimJob, build_job
from hetero_operator.simulator.lower_bound import (
    BoundError,
    BoundJob,
    bound_job,
    lower_bound,
    lower_bound_of_jobs,
    share_closed,
)
from hetero_operator.simulator.rate_bounds import job_rate_bounds
from hetero_operator.simulator.rates import allocation_rate, data_parallel_rate
from hetero_operator.simulator.trace import TraceJob, generate_trace

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
OPTIONS = EngineOptions()
# Models one K80 (12 GiB) holds, so every tiny cluster below can run them data-parallel.
SMALL_MODELS = ("resnet18", "lm", "recommendation", "cyclegan", "transformer")


def _cluster(gpus: dict[str, int]) -> Cluster:
    """One node per class; classes from v100 (fast) and k80 (slow, but faster for some models)."""
    speeds = {"v100": (1.0, 16), "k80": (0.2, 12)}
    return parse_cluster(
        {
            "classes": [{"name": c, "relativeSpeed": speeds[c][0], "memoryGiB": speeds[c][1]} for c in gpus],
            "nodeGroups": [{"gpuClass": c, "nodes": 1, "gpusPerNode": n} for c, n in gpus.items()],
        }
    )


def _catalog(cluster: Cluster) -> tuple[GPUClassInfo, ...]:
    return tuple(sorted(cluster.classes, key=lambda c: c.name))


# --- the rates the bound credits cover every allocation ------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    model=st.sampled_from((*SMALL_MODELS, "bert", "yolov3", "resnet50")),
    gpus_min=st.sampled_from([1, 2, 4]),
    factor=st.sampled_from([1, 2, 4]),
    restrict=st.sampled_from([(), ("v100", "p100"), ("p100", "k80"), ("v100", "k80")]),
    picks=st.lists(st.sampled_from(["v100", "p100", "k80"]), min_size=1, max_size=24),
)
def test_credits_and_peak_bound_every_data_parallel_allocation(
    model: str, gpus_min: int, factor: int, restrict: tuple[str, ...], picks: list[str]
) -> None:
    cluster = three_class_cluster()
    trace = TraceJob(
        job_id="j",
        arrival_s=0.0,
        model=model,
        gpus_min=gpus_min,
        gpus_max=gpus_min * factor,
        duration_s=600.0,
        gpu_classes=restrict,
    )
    try:
        job = build_job(trace, cluster, pipelines=False, prior=OPTIONS.prior)
    except JobSetupError:
        assume(False)
        return
    credits, peak = job_rate_bounds(job.request, cluster, OPTIONS.prior)
    mix: Counter[str] = Counter()
    for gpu_class in picks:
        if gpu_class in credits and mix[gpu_class] < 8 and mix.total() < job.request.gpus_max:
            mix[gpu_class] += 1
    assume(mix.total() >= gpus_min)
    rate = data_parallel_rate(job.request, mix, len(mix), _catalog(cluster), OPTIONS.prior)
    assume(rate is not None)
    assert rate is not None
    assert rate <= sum(n * credits[c] for c, n in mix.items()) * (1 + 1e-9)
    assert rate <= peak * (1 + 1e-9)


def test_a_pipeline_earns_no_more_than_its_gpus_credits() -> None:
    # ResNet-50 needs 14 GiB: two 12 GiB K80s hold one replica, so a pipeline policy runs it as HetPipe.
    cluster = three_class_cluster()
    trace = TraceJob(job_id="big", arrival_s=0.0, model="resnet50", gpus_min=2, gpus_max=8, duration_s=600)
    job = build_job(trace, cluster, pipelines=True, prior=OPTIONS.prior)
    assert job.request.strategy is Strategy.HETPIPE
    credits, peak = job_rate_bounds(job.request, cluster, OPTIONS.prior)
    layout = [("k80-0000", "k80", 0), ("k80-0000", "k80", 0), ("p100-0000", "p100", 1)]
    layout += [("p100-0000", "p100", 1), ("v100-0000", "v100", 2), ("v100-0000", "v100", 2)]
    workers = tuple(
        WorkerSlot(rank, node, gpu_class, virtual_worker=vw)
        for rank, (node, gpu_class, vw) in enumerate(layout)
    )
    rate = allocation_rate(job.request, Allocation(workers), _catalog(cluster), OPTIONS.prior)
    assert rate <= sum(credits[g] for _, g, _ in layout) * (1 + 1e-9)
    assert rate <= peak * (1 + 1e-9)


# --- below the best schedule an exhaustive search finds ------------------------------------------


def _allocations(job: SimJob, cluster: Cluster) -> list[tuple[Counter[str], float]]:
    """Every GPU count per class the job may hold (gang respected), with its samples/s."""
    gpus = cluster.gpus_per_class()
    classes = [c for c in cluster.class_names if job.request.allows(c)]
    out = []
    for counts in itertools.product(*(range(gpus[c] + 1) for c in classes)):
        mix = Counter({c: n for c, n in zip(classes, counts, strict=True) if n})
        if not job.request.gpus_min <= sum(mix.values()) <= job.request.gpus_max:
            continue
        rate = data_parallel_rate(job.request, mix, len(mix), _catalog(cluster), OPTIONS.prior)
        if rate is not None:
            out.append((mix, rate))
    return out


def _earliest_start(
    placed: Sequence[tuple[float, float, Counter[str]]],
    mix: Counter[str],
    gpus: dict[str, int],
    ready: float,
    length: float,
) -> float:
    """The first moment from ``ready`` at which ``mix`` fits for ``length`` beside ``placed``."""
    for start in sorted({ready, *(end for _, end, _ in placed if end > ready)}):
        checks = [start, *(s for s, _, _ in placed if start < s < start + length)]
        if all(
            sum(m[c] for s, e, m in placed if s <= t < e) + mix[c] <= gpus[c] for t in checks for c in mix
        ):
            return start
    raise AssertionError("a job always fits once every earlier one has finished")


def _best_non_preemptive_mean_jct(jobs: Sequence[SimJob], cluster: Cluster) -> float:
    """Every order and every allocation per job, each job started as early as the GPUs allow and
    run to completion (start-up, then its work at its allocation's rate): the least mean JCT."""
    gpus = cluster.gpus_per_class()
    choices = [_allocations(job, cluster) for job in jobs]
    best = math.inf
    for order in itertools.permutations(range(len(jobs))):
        for picked in itertools.product(*(choices[i] for i in order)):
            placed: list[tuple[float, float, Counter[str]]] = []
            total = 0.0
            for i, (mix, rate) in zip(order, picked, strict=True):
                length = OPTIONS.startup_s + jobs[i].work_samples / rate
                start = _earliest_start(placed, mix, gpus, jobs[i].trace.arrival_s, length)
                placed.append((start, start + length, mix))
                total += start + length - jobs[i].trace.arrival_s
            best = min(best, total / len(jobs))
    return best


tiny_job = st.tuples(
    st.sampled_from(SMALL_MODELS),
    st.sampled_from([1, 2]),  # gpus.min
    st.sampled_from([0, 1]),  # extra GPUs allowed above gpus.min
    st.floats(60.0, 3600.0),  # duration on the reference class
    st.floats(0.0, 1800.0),  # arrival
)


@settings(max_examples=30, deadline=None)
@given(
    gpus=st.sampled_from([{"v100": 1}, {"v100": 2}, {"v100": 1, "k80": 1}, {"v100": 2, "k80": 1}]),
    specs=st.lists(tiny_job, min_size=2, max_size=3),
)
def test_the_bound_is_below_an_exhaustive_search_and_above_isolation(
    gpus: dict[str, int], specs: list[tuple[str, int, int, float, float]]
) -> None:
    cluster = _cluster(gpus)
    total = sum(gpus.values())
    trace = [
        TraceJob(
            job_id=f"j{i}",
            arrival_s=arrival,
            model=model,
            gpus_min=min(gmin, total),
            gpus_max=min(gmin + extra, total),
            duration_s=duration,
        )
        for i, (model, gmin, extra, duration, arrival) in enumerate(specs)
    ]
    jobs = [build_job(r, cluster, pipelines=False, prior=OPTIONS.prior) for r in trace]
    assume(all(_allocations(job, cluster) for job in jobs))
    found = lower_bound(cluster, trace, OPTIONS)
    isolation = [bound_job(r, cluster, OPTIONS).isolation_jct_s for r in trace]
    assert found.avg_jct_s >= sum(isolation) / len(isolation) - 1e-6
    assert found.avg_jct_s <= _best_non_preemptive_mean_jct(jobs, cluster) + 1e-6


# --- capacity binds ------------------------------------------------------------------------------


def test_equal_jobs_on_one_gpu_come_close_to_their_optimum() -> None:
    """n equal jobs of length p arriving together on one GPU: the best mean JCT is (n+1)/2 * p."""
    n, p = 10, 100.0
    jobs = [BoundJob(f"j{i}", 0.0, 0.0, p, (("gpu", 1.0),), 1, 1.0) for i in range(n)]
    found = lower_bound_of_jobs(jobs, {"gpu": 1})
    optimum = (n + 1) / 2 * p
    assert found.isolation_avg_jct_s == pytest.approx(p)
    assert 0.85 * optimum <= found.avg_jct_s <= optimum + 1e-6
    assert found.beyond_window_share < 1e-6
    finer = lower_bound_of_jobs(jobs, {"gpu": 1}, resolution=16)
    assert found.avg_jct_s < finer.avg_jct_s <= optimum + 1e-6


def test_equal_jobs_queueing_for_one_simulated_gpu_stay_below_running_them_in_turn() -> None:
    cluster = _cluster({"v100": 1})
    trace = [row(f"j{i}", "resnet18", 1, 600.0) for i in range(6)]
    found = lower_bound(cluster, trace, OPTIONS)
    run = bound_job(trace[0], cluster, OPTIONS).min_runtime_s
    in_turn = (len(trace) + 1) / 2 * (OPTIONS.startup_s + run)  # start-up holds the GPU too
    assert found.isolation_avg_jct_s == pytest.approx(OPTIONS.startup_s + run)
    assert OPTIONS.startup_s + 0.85 * (len(trace) + 1) / 2 * run <= found.avg_jct_s <= in_turn


# --- a trace of the example cluster, and the command -------------------------------------------


def test_a_few_hundred_jobs_on_the_64_gpu_cluster_give_a_finite_bound_above_isolation() -> None:
    cluster = load_cluster(EXAMPLES / "cluster-64.yaml")
    trace = generate_trace(5, 300, capacity(cluster), 1.0, max_gpus=16, cluster=cluster)
    found = lower_bound(cluster, trace, OPTIONS)
    assert math.isfinite(found.avg_jct_s)
    assert found.avg_jct_s >= found.isolation_avg_jct_s
    assert set(found.jct_s) == {r.job_id for r in trace}
    assert all(found.jct_s[r.job_id] >= bound_job(r, cluster, OPTIONS).isolation_jct_s - 1e-6 for r in trace)


def test_a_job_no_policy_can_run_has_no_bound() -> None:
    cluster = _cluster({"k80": 2})
    # ResNet-50 fits no K80 and one GPU cannot hold a two-stage pipeline.
    with pytest.raises(BoundError, match="no policy can run it"):
        lower_bound(cluster, [row("big", "resnet50", 1, 600.0)], OPTIONS)


def test_simulate_with_bound_puts_every_policy_at_or_above_it() -> None:
    app = typer.Typer()
    app.command()(simulate_command)
    args = ["--cluster", str(EXAMPLES / "cluster-64.yaml"), "--trace", str(EXAMPLES / "trace-64.csv")]
    result = CliRunner().invoke(app, [*args, "--policy", "all", "--bound"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    bound = document["lower_bound"]
    assert bound["avg_jct"] >= bound["isolation_avg_jct"] > 0
    assert len(document["results"]) == 5
    for summary in document["results"]:
        assert summary["avg_jct_over_bound"] == pytest.approx(summary["avg_jct"] / bound["avg_jct"])
        assert summary["avg_jct_over_bound"] >= 1.0
    plain = json.loads(CliRunner().invoke(app, [*args, "--policy", "fifo"]).stdout)
    assert "lower_bound" not in plain and "avg_jct_over_bound" not in plain["results"][0]


def test_share_closed_is_the_part_of_the_baselines_distance_to_the_bound() -> None:
    assert share_closed(10.0, 7.0, 4.0) == 0.5  # 3 of the baseline's 6 above the bound
    assert share_closed(10.0, 12.0, 4.0) == pytest.approx(-1 / 3)  # worse than the baseline
    assert math.isnan(share_closed(4.0, 4.0, 4.0))
