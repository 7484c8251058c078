"""Scheduling on the live test bed: gangs, priorities, preemption, backfill, mixed classes, node loss.

The example cluster has 8 GPUs per class (two nodes of 4): fast (speed 1), medium (0.5), slow (0.25).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from tests.operator.conftest import gpu_classes_tolerating_kwok
from tests.operator.live import TOLERATE_KWOK, Jobs, OperatorProcess, wait_for

from hetero_operator import metric_names
from hetero_operator.controller import names
from hetero_operator.resources import Strategy
from hetero_operator.scheduler import GPUClassInfo, JobRequest, PriorModel
from hetero_operator.scheduler.throughput import JobShape, predict_data_parallel
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import FakeNode, node_manifest

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(120)]


def classes_of(jobs: Jobs, name: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for worker in jobs.status(name).get("allocation", {}).get("workers", []):
        counts[worker["gpuClass"]] = counts.get(worker["gpuClass"], 0) + worker["gpus"]
    return counts


def stays(check, seconds: float, interval: float = 0.5) -> bool:
    """True if `check` holds at every look during `seconds` (for "never happens" assertions)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not check():
            return False
        time.sleep(interval)
    return True


def test_a_gang_is_placed_whole_or_not_at_all(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("holder", gpus=6, gpuClasses=["fast"]))
    jobs.wait_phase("holder", "Running")
    jobs.apply(jobs.manifest("gang", gpus=4, gpuClasses=["fast"]))
    placed = wait_for(lambda: jobs.condition("gang", "Placed"), 20, "a Placed condition on the gang")
    assert placed["status"] == "False" and placed["reason"] == "WaitingForGPUs"
    assert "needs 4 GPUs at once" in placed["message"] and "class fast: 2 of 4 GPUs free" in placed["message"]
    assert stays(lambda: jobs.pods("gang") == [], 2), "part of the gang was started"
    jobs.finish(jobs.running_pods("holder"), 0)
    status = jobs.wait_phase("gang", "Running")
    assert status["allocation"]["totalGpus"] == 4 and len(jobs.running_pods("gang")) == 4


def test_a_job_larger_than_the_cluster_waits_and_says_why_per_class(
    operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(jobs.manifest("huge", gpus=30, batch={"global": 64}))
    placed = wait_for(lambda: jobs.condition("huge", "Placed"), 20, "a Placed condition")
    for gpu_class in ("fast", "medium", "slow"):
        assert f"class {gpu_class}:" in placed["message"]
    assert "cannot start until GPU nodes are added" in placed["message"]
    assert placed["reason"] == "InsufficientCapacity"
    waiting = jobs.status("huge")["waiting"]
    assert {c["gpuClass"]: c["wanted"] for c in waiting["classes"]} == {"fast": 30, "medium": 30, "slow": 30}
    assert jobs.phase("huge") == "Queued" and jobs.pods("huge") == []


def test_higher_priority_is_placed_first(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("top", gpus=8, gpuClasses=["fast"], priority=100))
    jobs.wait_phase("top", "Running")
    jobs.apply(jobs.manifest("early-low", gpus=8, gpuClasses=["fast"], priority=1))
    wait_for(lambda: jobs.condition("early-low", "Placed"), 20, "early-low to be considered")
    jobs.apply(jobs.manifest("late-high", gpus=8, gpuClasses=["fast"], priority=5))
    wait_for(lambda: jobs.condition("late-high", "Placed"), 20, "late-high to be considered")
    jobs.finish(jobs.running_pods("top"), 0)
    jobs.wait_phase("late-high", "Running")
    assert jobs.phase("early-low") == "Queued"


def test_preemption_checkpoints_the_lower_priority_job_first(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("low", gpus=8, gpuClasses=["fast"], priority=0))
    jobs.wait_phase("low", "Running")
    jobs.apply(jobs.manifest("urgent", gpus=4, gpuClasses=["fast"], priority=10))

    def asked() -> list[dict]:
        return [
            p
            for p in jobs.pods("low")
            if names.CHECKPOINT_REQUESTED_ANNOTATION in p["metadata"].get("annotations", {})
        ]

    # The requests go out together; wait for all eight, then check nobody else was asked.
    wait_for(lambda: len(asked()) == 8, 20, "all 8 low-priority workers to be asked for a checkpoint")
    assert len(asked()) == 8
    draining = jobs.condition("low", "Draining")
    assert (
        draining is not None
        and draining["reason"] == "Preempted"
        and "default/urgent" not in draining["message"]
    )
    status = jobs.wait_phase("urgent", "Running", timeout=30)
    assert classes_of(jobs, "urgent") == {"fast": 4}
    assert jobs.phase("low") == "Queued"  # needs 8, only 4 are free now: it waits
    assert "Preempted" in jobs.events("low")
    assert status["allocation"]["generation"] == 0
    metrics = httpx.get(f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).text
    counter = metric_names.total(metric_names.OPERATOR_PREEMPTIONS)
    preemptions = [line for line in metrics.splitlines() if line.startswith(counter)]
    assert preemptions and float(preemptions[0].split()[-1]) >= 1


def test_mixed_classes_when_the_predicted_throughput_is_higher(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("busy", gpus=6, gpuClasses=["fast"]))
    jobs.wait_phase("busy", "Running")
    jobs.apply(jobs.manifest("mixed", gpus=4, gpuClasses=["fast", "medium"], batch={"global": 64}))
    jobs.wait_phase("mixed", "Running")
    assert classes_of(jobs, "mixed") == {"fast": 2, "medium": 2}
    # The same prediction the scheduler made: two fast plus two medium beat four medium on one node.
    catalog = tuple(
        GPUClassInfo(c["metadata"]["name"], c["spec"]["relativeSpeed"], c["spec"]["memoryGiB"])
        for c in gpu_classes_tolerating_kwok()
    )
    request = JobRequest(
        key="x/mixed", gpus_min=4, gpus_max=4, global_batch=64, created_at=0.0, strategy=Strategy.DATA
    )
    shape = JobShape.of(request)
    mixed = predict_data_parallel(shape, (("fast", 2), ("medium", 2)), 2, catalog, PriorModel())
    single = predict_data_parallel(shape, (("medium", 4),), 1, catalog, PriorModel())
    assert mixed is not None and single is not None
    assert mixed.samples_per_second > single.samples_per_second


@pytest.fixture
def spare_nodes(testbed: Testbed) -> Iterator[list[str]]:
    """Two extra 2-GPU nodes of their own class, so a job can be pinned to them."""
    label = {"nvidia.com/gpu.product": "Spare-GPU"}
    nodes = [FakeNode(name=f"spare-{i}", gpuClass="spare", gpus=2, labels=label) for i in range(2)]
    gpu_class = {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": "spare"},
        "spec": {
            "nodeSelector": label,
            "memoryGiB": 16,
            "relativeSpeed": 0.25,
            "tolerations": [TOLERATE_KWOK],
        },
    }
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([gpu_class, *map(node_manifest, nodes)]))
    testbed.kubectl("wait", "--for=condition=Ready", "--timeout=30s", *(f"node/{n.name}" for n in nodes))
    yield [n.name for n in nodes]
    testbed.kubectl("delete", "node", *(n.name for n in nodes), "--wait=false", check=False)
    testbed.kubectl("delete", "gpuclass", "spare", "--wait=false", check=False)


def test_node_loss_requeues_and_places_elsewhere(
    operator: OperatorProcess, jobs: Jobs, testbed: Testbed, spare_nodes: list[str]
) -> None:
    jobs.apply(jobs.manifest("survivor", gpus=2, gpuClasses=["spare"]))
    status = jobs.wait_phase("survivor", "Running")
    lost = status["allocation"]["workers"][0]["node"]
    assert {w["node"] for w in status["allocation"]["workers"]} == {lost}
    testbed.kubectl("delete", "node", lost)

    def replaced() -> dict | None:
        now = jobs.status("survivor")
        workers = now.get("allocation", {}).get("workers", [])
        return now if now.get("phase") == "Running" and workers and workers[0]["node"] != lost else None

    status = wait_for(replaced, 40, "the job to run on the other node")
    assert status["allocation"]["generation"] == 1
    assert {w["node"] for w in status["allocation"]["workers"]} == set(spare_nodes) - {lost}
    assert "NodeLost" in jobs.events("survivor")
    assert {p["spec"]["nodeName"] for p in jobs.pods("survivor")} == set(spare_nodes) - {lost}
