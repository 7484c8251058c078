"""Every non-data strategy live: the operator places a digits job of each on three process nodes of
speeds 1, 0.5 and 0.25, writes its plan, and the job trains to the stated accuracy and Succeeds.
(`data` runs the same way in test_closed_loop.py.) One test bed and one operator (reading the bed's
Prometheus) serve them all; the jobs run one after another, since each takes every GPU.

The hetpipe job states no layer costs: the operator starts it on placeholder cuts, its workers measure
each layer on their own devices, and the operator re-cuts the pipeline from what they measured."""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from tests.operator.live import OperatorProcess, wait_for
from tests.reliability.faults_cluster import Cluster, status
from tests.reliability.faults_training import worker_run

from hetero_operator.controller import names
from hetero_operator.plan import Plan
from hetero_operator.rebalance import promql
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(900)]

NODE_CLASSES = {"local-fast": "fast", "local-medium": "medium", "local-slow": "slow"}
# Digits' held-out accuracy every strategy reaches with margin in these epochs (the runtime's own
# strategy tests see 0.93 to 0.97 at the same batch).
TARGET_ACCURACY = 0.90
JOB_SECONDS = 180  # each job, from apply to Succeeded, on a busy two-core machine


DIGITS_LAYERS = 5  # Linear 64x64, ReLU, Linear 64x64, ReLU, Linear 64x10
PLACEHOLDER_CUTS = [[1, 2]]  # one layer per stage but the last: what the operator starts without costs


@dataclass(frozen=True)
class StrategyCase:
    strategy: str
    epochs: int
    parameters: dict[str, Any]
    passes: int = 1  # passes over the training set per epoch


CASES = [
    # No virtualWorkerSize: the planner picks one pipeline of all three GPUs (1.75 against three
    # one-GPU workers at the slowest one's 0.75). No layerCosts: the workers measure them.
    # Epochs of a few seconds: the operator sees the costs, decides and re-cuts with epochs to spare.
    StrategyCase("hetpipe", 8, {"staleness": 0}, passes=10),
    StrategyCase("esync", 6, {}),
    StrategyCase("dreamddp", 6, {"period": 3}),
    StrategyCase("sesgd", 6, {"seed": 7}),
]


def strategy_job(case: StrategyCase, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": f"digits-{case.strategy}", "namespace": namespace},
        "spec": {
            "image": "heterotrain/trainer:0.1.0",
            "command": ["heterotrain", "worker", "digits"],
            "gpus": {"min": 3, "max": 3},
            "gpuClasses": ["fast", "medium", "slow"],
            "parallelism": {"strategy": case.strategy, case.strategy: case.parameters},
            "env": [{"name": "DIGITS_PASSES_PER_EPOCH", "value": str(case.passes)}],
            "batch": {"global": 64},
            "epochs": case.epochs,
            "restartPolicy": {"maxRestarts": 0, "backoffSeconds": 0},
            # Only hetpipe's stage cuts are re-planned (from measured layer costs); the batch splits stay.
            "rebalance": {
                "enabled": case.strategy == "hetpipe",
                "initialSplit": "prior",
                "everyEpochs": 1,
                "minImprovement": 0.05,
            },
        },
    }


@pytest.fixture(scope="module")
def cluster(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One operator and one namespace for every strategy's job."""
    namespace = f"strategies-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    log = tmp_path_factory.mktemp("strategies-operator") / "operator.log"
    operator = OperatorProcess(bed, log, extra_args=("--prometheus-url", bed.prometheus_url))
    operator.start()
    try:
        yield Cluster(str(bed.kubeconfig), namespace)
    finally:
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(60)}")


def _logs(bed: Testbed, namespace: str, job: str) -> str:
    runs = [worker_run(bed, namespace, job, 0, rank) for rank in range(3)]
    return "\n".join(f"--- rank {r} ---\n{run.log[-3000:]}" for r, run in enumerate(runs) if run is not None)


@pytest.mark.parametrize("case", CASES, ids=[c.strategy for c in CASES])
def test_strategy_trains_digits_on_three_speeds(bed: Testbed, cluster: Cluster, case: StrategyCase) -> None:
    job = f"digits-{case.strategy}"
    started = time.monotonic()
    cluster.apply(strategy_job(case, cluster.namespace))
    recut = watch_recut(bed, cluster, job) if case.strategy == "hetpipe" else None
    final = cluster.until(lambda s: s.phase(job) in ("Succeeded", "Failed"), JOB_SECONDS, f"{job} to end")
    wall = time.monotonic() - started
    assert final.phase(job) == "Succeeded", _logs(bed, cluster.namespace, job)
    state = status(final.jobs[job])
    # The operator placed one worker on each node, of that node's class.
    workers = state["allocation"]["workers"]
    assert sorted((w["node"], w["gpuClass"]) for w in workers) == sorted(NODE_CLASSES.items())
    run = worker_run(bed, cluster.namespace, job, 0, 0)
    assert run is not None
    progress = run.progress()
    assert [line["epoch"] for line in progress] == list(range(1, case.epochs + 1))
    accuracy = (progress[-1].get("evaluation") or {}).get("accuracy")
    curve = [round((line.get("evaluation") or {}).get("accuracy", 0.0), 3) for line in progress]
    print(f"{case.strategy}: accuracy {accuracy}, {wall:.0f} s from apply to Succeeded, per epoch {curve}")
    assert accuracy is not None and accuracy >= TARGET_ACCURACY, _logs(bed, cluster.namespace, job)
    if case.strategy == "hetpipe":
        assert recut is not None
        check_hetpipe_layout(bed, cluster.namespace, job, workers, recut)


@dataclass(frozen=True)
class Recut:
    first: Plan
    second: Plan
    costs: dict[int, list[float]]  # per rank, each layer's per-sample seconds, as Prometheus had them


def plan_of(bed: Testbed, namespace: str, job: str) -> Plan | None:
    found = bed.kubectl(
        "get", "configmap", names.plan_config_map_name(job), "-n", namespace, "-o", "json", check=False
    )
    if found.returncode != 0:
        return None
    return Plan.model_validate_json(json.loads(found.stdout)["data"]["plan.json"])


def watch_recut(bed: Testbed, cluster: Cluster, job: str) -> Recut:
    """The first plan, the re-cut one, and the layer costs the workers exported (read while they run:
    their series go stale once the pods are gone)."""
    first = wait_for(lambda: plan_of(bed, cluster.namespace, job), JOB_SECONDS, "the first plan")
    second = wait_for(
        lambda: (p := plan_of(bed, cluster.namespace, job)) is not None and p.version >= 2 and p,
        JOB_SECONDS,
        "a re-cut plan",
    )
    query = promql.layer_cost_query(cluster.namespace, job)
    body = httpx.get(f"{bed.prometheus_url}/api/v1/query", params={"query": query}, timeout=10).json()
    rows = [(dict(r["metric"]), float(r["value"][1])) for r in body["data"]["result"]]
    return Recut(first, second, promql.parse_layer_costs(rows))


def slowest_stage(reference: list[float], speeds: list[float], cuts: Sequence[int]) -> float:
    """A pipeline's slowest stage: each stage's layers at the reference costs over its speed."""
    bounds = [0, *cuts, len(reference)]
    return max(sum(reference[bounds[s] : bounds[s + 1]]) / speed for s, speed in enumerate(speeds))


def best_by_brute_force(reference: list[float], speeds: list[float]) -> float:
    """The fastest slowest stage over every way to cut the layers into one stage per speed."""
    cuts = itertools.combinations(range(1, len(reference)), len(speeds) - 1)
    return min(slowest_stage(reference, speeds, c) for c in cuts)


def check_hetpipe_layout(
    bed: Testbed, namespace: str, job: str, workers: list[dict[str, Any]], recut: Recut
) -> None:
    """One virtual worker, its stages in speed order; first cut as placeholders, then re-cut where
    the workers' measured costs balance the stages, and the workers ran the new slices."""
    stages = sorted((w["virtualWorker"], w["stage"], w["gpuClass"]) for w in workers)
    assert stages == [(0, 0, "fast"), (0, 1, "medium"), (0, 2, "slow")]
    assert recut.first.hetpipe is not None and recut.second.hetpipe is not None
    assert recut.first.hetpipe.stage_boundaries == PLACEHOLDER_CUTS
    assert recut.second.learning_rate_scale == recut.first.learning_rate_scale == 1.0
    ranks = recut.first.hetpipe.virtual_workers[0]
    costs = recut.costs
    assert sorted(costs) == [0, 1, 2] and all(len(c) == DIGITS_LAYERS for c in costs.values()), costs
    # The measured speeds: the fastest rank's total cost over each rank's.
    totals = {rank: sum(costs[rank]) for rank in ranks}
    reference = min(ranks, key=lambda rank: totals[rank])
    speeds = [totals[reference] / totals[rank] for rank in ranks]
    print(f"hetpipe: layer costs (us/sample) {costs}, measured stage speeds {speeds}")
    # The operator's cuts are a best cut (several may tie: the slowest stage is often a last layer).
    (cuts,) = recut.second.hetpipe.stage_boundaries
    best = best_by_brute_force(costs[reference], speeds)
    assert slowest_stage(costs[reference], speeds, cuts) == pytest.approx(best, rel=1e-9)
    assert best < slowest_stage(costs[reference], speeds, PLACEHOLDER_CUTS[0]) * 0.95
    # The slow ranks' measured speeds are their nodes' (0.5 and 0.25 of the fast one's): every
    # simulated GPU is a fraction of one base device, whichever core of the host each rank ran on.
    assert speeds[1] == pytest.approx(0.5, rel=1e-6) and speeds[2] == pytest.approx(0.25, rel=1e-6)
    logs = {rank: worker_run(bed, namespace, job, 0, rank) for rank in ranks}
    bounds = [0, *cuts, DIGITS_LAYERS]
    for stage, rank in enumerate(ranks):
        run = logs[rank]
        assert run is not None
        assert f"this rank runs layers {bounds[stage]} to {bounds[stage + 1] - 1}" in run.log, run.log[-2000:]
