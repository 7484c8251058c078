"""A training script of the user's own, live: the operator's pods run `heterotrain worker -- python
SCRIPT` on three local process nodes of speeds 1, 0.5 and 0.25. The plain DDP script trains with an
even split; its port trains with the plan the operator published (split by the classes' priors); the
port under a non-data strategy fails with the message that names the fix when `heterotrain worker --`
launches it, and trains under `dreamddp` and `esync` when it is the pod's command itself. A port whose
ranks scale their losses differently is stopped by the divergence guard: Failed, reason Diverged, in
the job's conditions, its events and `kubectl describe`, and not restarted."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import OperatorProcess
from tests.reliability.faults_cluster import Cluster, Snapshot, status
from tests.reliability.faults_training import worker_run

import hetero_runtime.examples.ddp_digits as plain_example
import hetero_runtime.examples.ddp_digits_hetero as ported_example
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(900)]

# Two epochs: what the operator adds (its plan, the pod's environment, the epoch boundary) shows in
# both; how far each strategy trains the port is proven once, in tests/runtime/test_byos_strategies.py.
EPOCHS = 2


def script_job(
    name: str, namespace: str, module: str, strategy: str = "data", *, launcher: bool = True
) -> dict[str, Any]:
    # Process nodes run the pod's command on this host with this environment (the image is not
    # pulled). The script goes by module name: a host path under a directory the pod mounts (such as
    # a checkout in /tmp) would be read as the pod's own. Without the launcher the script is the
    # command: its heterotrain.init() reads the pod's environment itself.
    command = ["python", "-m", module, "--epochs", str(EPOCHS)]
    if launcher:
        command = ["heterotrain", "worker", "--", *command]
    parallelism: dict[str, Any] = {"strategy": strategy}
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "heterotrain/trainer:0.1.0",
            "command": command,
            "gpus": {"min": 3, "max": 3},
            "gpuClasses": ["fast", "medium", "slow"],
            "parallelism": parallelism,
            "batch": {"global": 64},
            "epochs": EPOCHS,
            "restartPolicy": {"maxRestarts": 0, "backoffSeconds": 0},
            "rebalance": {"enabled": False, "initialSplit": "prior"},
        },
    }


@contextmanager
def operator_on_a_namespace(bed: Testbed, tmp_path: Path, prefix: str) -> Iterator[tuple[str, Cluster]]:
    """A fresh namespace and an operator running; its jobs are deleted and the operator stopped after."""
    namespace = f"{prefix}-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(bed, tmp_path / "operator.log")
    operator.start()
    try:
        yield namespace, Cluster(str(bed.kubeconfig), namespace)
    finally:
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()


def run_to_end(cluster: Cluster, job: dict[str, Any]) -> Snapshot:
    name = job["metadata"]["name"]
    cluster.apply(job)
    return cluster.until(lambda s: s.phase(name) in ("Succeeded", "Failed"), 300, f"{name} to end")


def test_own_scripts_run_in_the_operators_pods(bed: Testbed, tmp_path: Path) -> None:
    with operator_on_a_namespace(bed, tmp_path, "own") as (namespace, cluster):
        final = run_to_end(cluster, script_job("plain", namespace, plain_example.__name__))
        assert final.phase("plain") == "Succeeded", worker_run(bed, namespace, "plain", 0, 0)
        final = run_to_end(cluster, script_job("ported", namespace, ported_example.__name__))
        assert final.phase("ported") == "Succeeded", worker_run(bed, namespace, "ported", 0, 0)
        plan = status(final.jobs["ported"])["plan"]
        dream = script_job("dream", namespace, ported_example.__name__, strategy="dreamddp")
        refused = run_to_end(cluster, dream)
    plain_log = worker_run(bed, namespace, "plain", 0, 0)
    assert plain_log is not None and f"epoch {EPOCHS}: loss" in plain_log.log
    # The port trained every epoch with rank 0's share of the operator's uneven plan.
    assert len(set(plan["localBatches"])) > 1, plan
    ported_run = worker_run(bed, namespace, "ported", 0, 0)
    assert ported_run is not None
    progress = ported_run.progress()
    assert [line["epoch"] for line in progress] == list(range(1, EPOCHS + 1))
    assert all(line["local_batch"] == plan["localBatches"][0] for line in progress)
    assert all(line["plan_version"] == plan["version"] for line in progress)
    assert refused.phase("dream") == "Failed"
    dream_run = worker_run(bed, namespace, "dream", 0, 0)
    assert dream_run is not None and "spec.parallelism.strategy: data" in dream_run.log


# The port with mixed precision on rank 1 only (bf16 autocast and a GradScaler), as a script that picks
# its AMP per GPU might: rank 1's gradient carries the loss scale, the others' do not.
AMP_ON_RANK_ONE = (
    "import os, runpy, sys; "
    f"sys.argv = ['train', '--epochs', '{EPOCHS}'] + (['--amp'] if os.environ['RANK'] == '1' else []); "
    f"runpy.run_module('{ported_example.__name__}', run_name='__main__')"
)


def test_ranks_whose_losses_carry_different_scales_fail_the_job_as_diverged(
    bed: Testbed, tmp_path: Path
) -> None:
    with operator_on_a_namespace(bed, tmp_path, "own-diverged") as (namespace, cluster):
        job = script_job("mixed", namespace, ported_example.__name__)
        job["spec"]["command"] = ["heterotrain", "worker", "--", "python", "-c", AMP_ON_RANK_ONE]
        job["spec"]["restartPolicy"] = {"maxRestarts": 2, "backoffSeconds": 0}
        final = run_to_end(cluster, job)
        described = bed.kubectl("describe", "htj", "mixed", "-n", namespace).stdout
        events = bed.kubectl("get", "events", "-n", namespace, "-o", "json").stdout
    assert final.phase("mixed") == "Failed", worker_run(bed, namespace, "mixed", 0, 0)
    assert status(final.jobs["mixed"]).get("restarts", 0) == 0  # two were allowed: none was taken
    failed = next(c for c in status(final.jobs["mixed"])["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Diverged", failed
    assert "the parameters of rank 1 differ from rank 0's after step 1 (epoch 0)" in failed["message"], failed
    assert "Diverged" in described and "rank 1 differ from rank 0's" in described, described
    reasons = [e["reason"] for e in json.loads(events)["items"] if e["involvedObject"]["name"] == "mixed"]
    assert "Diverged" in reasons, reasons


# (sesgd runs the same path; in-process in tests/runtime/test_byos_strategies.py, as it takes two
# minutes here: each step's ring waits on ranks slowed to 1/8 and 1/16.)
@pytest.mark.parametrize("strategy", ["dreamddp", "esync"])
def test_the_port_trains_under_the_local_step_strategies_in_the_operators_pods(
    bed: Testbed, tmp_path: Path, strategy: str
) -> None:
    with operator_on_a_namespace(bed, tmp_path, f"own-{strategy}") as (namespace, cluster):
        port = script_job("port", namespace, ported_example.__name__, strategy, launcher=False)
        final = run_to_end(cluster, port)
    assert final.phase("port") == "Succeeded", worker_run(bed, namespace, "port", 0, 0)
    plan = status(final.jobs["port"])["plan"]
    assert len(set(plan["localBatches"])) > 1, plan
    rank_zero = worker_run(bed, namespace, "port", 0, 0)
    assert rank_zero is not None
    # Rank 0 trained every epoch under the strategy, with its share of the operator's uneven plan.
    progress = rank_zero.progress()
    assert [line["epoch"] for line in progress] == list(range(1, EPOCHS + 1))
    assert all(line["strategy"] == strategy for line in progress), progress
    assert all(line["local_batch"] == plan["localBatches"][0] for line in progress), progress
