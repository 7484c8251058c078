"""Every non-data strategy live: the operator places a digits job of each on three process nodes of
speeds 1, 0.5 and 0.25, writes its plan, and the job trains to the stated accuracy and Succeeds.
(`data` runs the same way in test_closed_loop.py.) One test bed and one operator serve them all; the
jobs run one after another, since each takes every GPU."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from tests.operator.live import OperatorProcess
from tests.reliability.faults_cluster import Cluster, status
from tests.reliability.faults_training import worker_run

from hetero_operator.controller import names
from hetero_operator.plan import Plan
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(900)]

NODE_CLASSES = {"local-fast": "fast", "local-medium": "medium", "local-slow": "slow"}
# Digits' held-out accuracy every strategy reaches with margin in these epochs (the runtime's own
# strategy tests see 0.93 to 0.97 at the same batch).
TARGET_ACCURACY = 0.90
JOB_SECONDS = 180  # each job, from apply to Succeeded, on a busy two-core machine


DIGITS_LAYER_COSTS = [4161.0, 1.0, 4161.0, 1.0, 651.0]  # Linear 64x64, ReLU, Linear 64x64, ReLU, Linear 64x10
# The minimum-bottleneck cuts of those costs over speeds 1, 0.5, 0.25 (by hand: 4162, 8322, 2608).
DIGITS_CUTS = [[2, 3]]


@dataclass(frozen=True)
class StrategyCase:
    strategy: str
    epochs: int
    parameters: dict[str, Any]
    passes: int = 1  # passes over the training set per epoch


CASES = [
    # No virtualWorkerSize: the planner picks one pipeline of all three GPUs (1.75 against three
    # one-GPU workers at the slowest one's 0.75); the layer costs are digits' parameters + 1.
    StrategyCase("hetpipe", 8, {"staleness": 0, "layerCosts": DIGITS_LAYER_COSTS}, passes=2),
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
            "rebalance": {"enabled": False, "initialSplit": "prior"},
        },
    }


@pytest.fixture(scope="module")
def cluster(bed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One operator and one namespace for every strategy's job."""
    namespace = f"strategies-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(bed, tmp_path_factory.mktemp("strategies-operator") / "operator.log")
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
        check_hetpipe_layout(bed, cluster.namespace, job, workers)


def check_hetpipe_layout(bed: Testbed, namespace: str, job: str, workers: list[dict[str, Any]]) -> None:
    """One virtual worker, its stages in speed order, cut where the planner balances the layer costs."""
    stages = sorted((w["virtualWorker"], w["stage"], w["gpuClass"]) for w in workers)
    assert stages == [(0, 0, "fast"), (0, 1, "medium"), (0, 2, "slow")]
    config_map = bed.kubectl(
        "get", "configmap", names.plan_config_map_name(job), "-n", namespace, "-o", "json"
    )
    plan = Plan.model_validate_json(json.loads(config_map.stdout)["data"]["plan.json"])
    assert plan.hetpipe is not None
    assert plan.hetpipe.stage_boundaries == DIGITS_CUTS
    assert plan.learning_rate_scale == 1.0
