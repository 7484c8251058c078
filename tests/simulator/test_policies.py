"""Policy sanity on hand-made cases: mixing classes must win where one class is too small."""

from __future__ import annotations

import numpy as np
import pytest
from sim_cases import row, three_class_cluster

from hetero_operator.scheduler import JobRequest, PriorModel, Snapshot
from hetero_operator.simulator.cluster import parse_cluster
from hetero_operator.simulator.engine import simulate
from hetero_operator.simulator.jobs import build_job
from hetero_operator.simulator.policies import FifoGangPolicy, GavelPolicy, make_policy
from hetero_operator.simulator.policies.gavel import Pair, max_min_shares

PRIOR = PriorModel()


def _v100_and_p100(v100: int, p100: int):  # type: ignore[no-untyped-def]
    return parse_cluster(
        {
            "classes": [
                {"name": "p100", "relativeSpeed": 0.5, "memoryGiB": 16},
                {"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16},
            ],
            "nodeGroups": [
                {"gpuClass": "v100", "nodes": 1, "gpusPerNode": v100},
                {"gpuClass": "p100", "nodes": 1, "gpusPerNode": p100},
            ],
        }
    )


def test_mixing_classes_beats_one_class_when_the_fast_class_is_too_small() -> None:
    # 4 V100 + 8 P100, one 8-GPU job: one class means 8 P100; heterotrain adds the 4 V100 and
    # splits the batch so the V100s take more of it.
    cluster = _v100_and_p100(4, 8)
    trace = [row("wide", "transformer", 8, 7200)]
    jct = {
        name: simulate(cluster, trace, make_policy(name)).outcomes[0].jct_s
        for name in ("fifo", "gavel", "heterotrain")
    }
    mixed = simulate(cluster, trace, make_policy("heterotrain")).outcomes[0].classes_used
    assert mixed == {"v100", "p100"}
    assert jct["heterotrain"] < 0.85 * jct["fifo"]
    assert jct["heterotrain"] < 0.85 * jct["gavel"]


def test_heterotrain_runs_a_model_too_big_for_the_small_class_on_it_as_pipelines() -> None:
    # ResNet-50 needs 14 GiB: a 12 GiB K80 cannot hold it alone, two K80s as a pipeline can. With a
    # queue of such jobs the K80s add capacity the one-class policies cannot use at all.
    cluster = three_class_cluster(v100_nodes=1, p100_nodes=1, k80_nodes=1, gpus=2)
    trace = [row(f"j{i}", "resnet50", 2, 3600, arrival_s=float(i)) for i in range(8)]
    hetero = simulate(cluster, trace, make_policy("heterotrain"))
    fifo = simulate(cluster, trace, make_policy("fifo"))
    assert any("k80" in o.classes_used for o in hetero.outcomes)
    assert all("k80" not in o.classes_used for o in fifo.outcomes)
    assert hetero.busy_gpu_seconds["k80"] > 0 and fifo.busy_gpu_seconds["k80"] == 0
    assert max(o.first_start_s or 0.0 for o in hetero.outcomes) < max(
        o.first_start_s or 0.0 for o in fifo.outcomes
    )


def test_strict_fifo_lets_nothing_pass_a_blocked_head() -> None:
    cluster = three_class_cluster(gpus=4)
    jobs = tuple(
        build_job(r, cluster, pipelines=False, prior=PRIOR).request
        for r in (
            row("big", "resnet18", 8, 60),
            row("small", "resnet18", 1, 60, arrival_s=1),
        )
    )
    decided = FifoGangPolicy().decide(Snapshot(cluster.classes, cluster.nodes, jobs))
    assert decided.place == {}
    assert "waiting behind sim/big" in decided.unschedulable["sim/small"].message


def test_fifo_is_speed_blind_and_takes_the_class_with_most_free_gpus() -> None:
    cluster = _v100_and_p100(8, 16)
    (job,) = (build_job(row("a", "resnet18", 4, 60), cluster, pipelines=False, prior=PRIOR).request,)
    decided = FifoGangPolicy().decide(Snapshot(cluster.classes, cluster.nodes, (job,)))
    assert set(decided.place["sim/a"].gpus_per_class()) == {"p100"}


def _job(key: str, gpus: int) -> JobRequest:
    return JobRequest(key=f"sim/{key}", gpus_min=gpus, gpus_max=gpus, global_batch=64, created_at=0.0)


def test_max_min_shares_split_one_gpu_evenly_between_two_jobs() -> None:
    jobs = [_job("a", 1), _job("b", 1)]
    shares = max_min_shares(jobs, [Pair(0, "x", 1.0), Pair(1, "x", 1.0)], {"x": 1})
    assert shares == pytest.approx([0.5, 0.5], abs=1e-6)


def test_max_min_shares_send_each_job_where_it_is_relatively_best() -> None:
    # Job 0 runs 4x faster on "fast", job 1 only 1.2x: fairness gives "fast" to job 0.
    jobs = [_job("a", 1), _job("b", 1)]
    pairs = [
        Pair(0, "fast", 1.0),
        Pair(0, "slow", 0.25),
        Pair(1, "fast", 1.0),
        Pair(1, "slow", 1 / 1.2),
    ]
    shares = dict(
        zip(
            [(p.job, p.gpu_class) for p in pairs],
            max_min_shares(jobs, pairs, {"fast": 1, "slow": 1}),
            strict=True,
        )
    )
    assert shares[(0, "fast")] > shares[(1, "fast")]
    assert shares[(1, "slow")] > shares[(0, "slow")]
    for job in (0, 1):
        assert shares[(job, "fast")] + shares[(job, "slow")] <= 1 + 1e-6


def test_max_min_shares_respect_class_capacity() -> None:
    jobs = [_job(str(i), 2) for i in range(5)]
    pairs = [Pair(i, "x", 1.0) for i in range(5)]
    shares = max_min_shares(jobs, pairs, {"x": 4})
    assert float(np.dot(shares, [2] * 5)) <= 4 + 1e-6
    assert shares == pytest.approx([0.4] * 5, abs=1e-5)


def test_gavel_keeps_a_job_on_its_gpus_when_it_keeps_its_class() -> None:
    cluster = _v100_and_p100(4, 4)
    policy = GavelPolicy()
    job = build_job(row("a", "resnet18", 2, 60), cluster, pipelines=False, prior=PRIOR).request
    first = policy.decide(Snapshot(cluster.classes, cluster.nodes, (job,)))
    placed = first.place["sim/a"]
    running = JobRequest(**{**{f: getattr(job, f) for f in job.__dataclass_fields__}, "current": placed})
    second = policy.decide(Snapshot(cluster.classes, cluster.nodes, (running,), now=360.0))
    assert second.place == {} and second.preempt == {}


def test_fifo_backfill_lets_a_later_job_pass_a_blocked_head() -> None:
    cluster = three_class_cluster(gpus=4)
    jobs = tuple(
        build_job(r, cluster, pipelines=False, prior=PRIOR).request
        for r in (row("big", "resnet18", 8, 60), row("small", "resnet18", 1, 60, arrival_s=1))
    )
    decided = make_policy("fifo-backfill").decide(Snapshot(cluster.classes, cluster.nodes, jobs))
    assert set(decided.place) == {"sim/small"} and "sim/big" in decided.unschedulable
    assert not decided.preempt and not decided.grow


def test_greedy_fastest_picks_the_fastest_class_for_the_jobs_own_model() -> None:
    # Gavel's table: Recommendation runs 16.6 iterations/s on a P100, 10.4 on a K80 and 7.5 on a
    # V100; ResNet-18 is fastest on the V100. Speed-blind FIFO takes the class with most free GPUs.
    cluster = parse_cluster(
        {
            "classes": [
                {"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16},
                {"name": "p100", "relativeSpeed": 0.5, "memoryGiB": 16},
                {"name": "k80", "relativeSpeed": 0.2, "memoryGiB": 12},
            ],
            "nodeGroups": [
                {"gpuClass": "v100", "nodes": 1, "gpusPerNode": 2},
                {"gpuClass": "p100", "nodes": 1, "gpusPerNode": 2},
                {"gpuClass": "k80", "nodes": 1, "gpusPerNode": 8},
            ],
        }
    )

    def first_class(policy: str, model: str) -> str:
        job = build_job(row("a", model, 1, 60), cluster, pipelines=False, prior=PRIOR).request
        decided = make_policy(policy).decide(Snapshot(cluster.classes, cluster.nodes, (job,)))
        (gpu_class,) = decided.place["sim/a"].gpus_per_class()
        return gpu_class

    assert first_class("greedy-fastest", "recommendation") == "p100"
    assert first_class("greedy-fastest", "resnet18") == "v100"
    assert first_class("fifo-backfill", "resnet18") == "k80"


def test_greedy_fastest_falls_back_to_the_next_fastest_class_with_room() -> None:
    cluster = _v100_and_p100(2, 4)
    jobs = tuple(
        build_job(
            row(name, "resnet18", 2, 60, arrival_s=float(i)), cluster, pipelines=False, prior=PRIOR
        ).request
        for i, name in enumerate(("first", "second"))
    )
    decided = make_policy("greedy-fastest").decide(Snapshot(cluster.classes, cluster.nodes, jobs))
    assert decided.place["sim/first"].gpus_per_class() == {"v100": 2}
    assert decided.place["sim/second"].gpus_per_class() == {"p100": 2}
