"""The pydantic models of heterotrain.io/v1alpha1: parsing, defaults, cross-field rules, status helpers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.resources import (
    API_VERSION,
    Allocation,
    AllocationPolicy,
    Condition,
    ConditionStatus,
    ESyncParameters,
    GPUClass,
    HeteroQueue,
    HeteroTrainJob,
    HeteroTrainJobStatus,
    HetPipeParameters,
    InvalidResourceError,
    Phase,
    Plan,
    RebalanceRecord,
    Strategy,
    WorkerAllocation,
)
from hetero_operator.resources.base import field_path
from hetero_operator.resources.job_status import MAX_REBALANCE_HISTORY, summarise_classes

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
INVALID_CASES = yaml.safe_load((REPO / "tests" / "data" / "invalid_manifests.yaml").read_text())
MODELS: dict[str, type[HeteroTrainJob] | type[GPUClass] | type[HeteroQueue]] = {
    "HeteroTrainJob": HeteroTrainJob,
    "GPUClass": GPUClass,
    "HeteroQueue": HeteroQueue,
}


def minimal_job(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "HeteroTrainJob",
        "metadata": {"name": "job", "namespace": "team-a", "generation": 2},
        "spec": {
            "image": "trainer:1",
            "gpus": {"min": 2, "max": 4},
            "batch": {"global": 64},
            "epochs": 3,
            **spec,
        },
    }


def documents(path: Path) -> list[Any]:
    return [document for document in yaml.safe_load_all(path.read_text()) if document is not None]


def example_objects() -> list[dict[str, Any]]:
    """Every Kubernetes object of our API in examples/, found by content rather than by file name."""
    return [
        document
        for path in sorted(EXAMPLES.glob("*.yaml"))
        for document in documents(path)
        if isinstance(document, dict) and document.get("apiVersion") == API_VERSION
    ]


# --- examples --------------------------------------------------------------------------------------------


def test_examples_cover_every_strategy_and_three_gpu_classes() -> None:
    objects = example_objects()
    jobs = [HeteroTrainJob.from_k8s(obj) for obj in objects if obj["kind"] == "HeteroTrainJob"]
    classes = [GPUClass.from_k8s(obj) for obj in objects if obj["kind"] == "GPUClass"]
    assert {job.spec.parallelism.strategy for job in jobs} == set(Strategy)
    assert len(classes) >= 3
    assert len({gpu_class.spec.relative_speed for gpu_class in classes}) == len(classes)


@pytest.mark.parametrize("obj", example_objects(), ids=lambda obj: f"{obj['kind']}/{obj['metadata']['name']}")
def test_example_round_trips(obj: dict[str, Any]) -> None:
    model = MODELS[obj["kind"]].from_k8s(obj)
    assert MODELS[obj["kind"]].from_k8s(model.to_k8s()) == model
    # Everything the user wrote survives the round trip unchanged.
    assert _contains(model.to_k8s(), obj)


def _contains(big: Any, small: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            key in big and _contains(big[key], value) for key, value in small.items()
        )
    return bool(big == small)


def test_digits_job_runs_on_three_classes() -> None:
    job = HeteroTrainJob.from_k8s(documents(EXAMPLES / "job-digits.yaml")[0])
    assert job.spec.gpus.min == job.spec.gpus.max == 3
    assert len(job.spec.gpu_classes) == 3
    assert job.spec.command == ["heterotrain", "worker", "digits"]


def test_test_bed_nodes_match_the_example_gpu_classes() -> None:
    (node_list,) = documents(EXAMPLES / "nodes.yaml")
    classes = {
        obj["metadata"]["name"]: GPUClass.from_k8s(obj) for obj in documents(EXAMPLES / "gpuclasses.yaml")
    }
    nodes = node_list["nodes"]
    assert 5 <= len(nodes) <= 8
    assert {node["gpuClass"] for node in nodes} == set(classes)
    for node in nodes:
        assert set(node) == {"name", "gpuClass", "gpus", "labels"}
        assert isinstance(node["gpus"], int) and node["gpus"] > 0
        selector = classes[node["gpuClass"]].spec.node_selector
        assert selector.items() <= node["labels"].items(), node["name"]


# --- defaults and wire names -----------------------------------------------------------------------------


def test_defaults_of_a_minimal_job() -> None:
    spec = HeteroTrainJob.from_k8s(minimal_job()).spec
    assert spec.parallelism.strategy is Strategy.DATA
    assert spec.parallelism.parameters() is None
    assert (spec.rebalance.enabled, spec.rebalance.every_epochs, spec.rebalance.min_improvement) == (
        True,
        1,
        0.05,
    )
    assert (spec.restart_policy.max_restarts, spec.restart_policy.backoff_seconds) == (3, 10)
    assert (spec.priority, spec.queue, spec.suspend, spec.checkpoint) == (0, "default", False, None)
    assert (spec.batch.lowest, spec.batch.highest, spec.batch.adaptive) == (64, 64, False)
    assert spec.gpu_classes == [] and spec.env == []


def test_strategy_parameters_default_when_the_block_is_left_out() -> None:
    parallelism = HeteroTrainJob.from_k8s(minimal_job(parallelism={"strategy": "hetpipe"})).spec.parallelism
    assert parallelism.parameters() == HetPipeParameters()
    assert HetPipeParameters().allocation_policy is AllocationPolicy.AUTO
    given_block = {"strategy": "esync", "esync": {"maxLocalSteps": 9}}
    parameters = HeteroTrainJob.from_k8s(minimal_job(parallelism=given_block)).spec.parallelism.parameters()
    assert parameters == ESyncParameters(max_local_steps=9)


def test_wire_names_are_camel_case_and_python_names_snake_case() -> None:
    job = HeteroTrainJob.from_k8s(
        minimal_job(
            gpuClasses=["fast"],
            batch={"global": 64, "perGpuClassMax": {"fast": 32}},
            restartPolicy={"maxRestarts": 1},
        )
    )
    assert job.spec.gpu_classes == ["fast"]
    assert job.spec.batch.per_gpu_class_max == {"fast": 32}
    assert job.spec.restart_policy.max_restarts == 1
    wire = job.to_k8s()
    assert wire["spec"]["batch"]["global"] == 64
    assert wire["spec"]["restartPolicy"]["maxRestarts"] == 1
    assert (job.name, job.namespace, job.generation) == ("job", "team-a", 2)
    gpu_class = GPUClass.from_k8s(
        {
            "kind": "GPUClass",
            "metadata": {"name": "t4"},
            "spec": {"nodeSelector": {"a": "b"}, "memoryGiB": 16, "relativeSpeed": 0.3},
        }
    )
    assert gpu_class.to_k8s()["spec"] == {
        "nodeSelector": {"a": "b"},
        "resourceName": "nvidia.com/gpu",
        "memoryGiB": 16.0,
        "relativeSpeed": 0.3,
        "costWeight": 1.0,
    }


def test_wrong_kind_or_api_version_is_rejected() -> None:
    with pytest.raises(InvalidResourceError, match="kind"):
        HeteroTrainJob.from_k8s({**minimal_job(), "kind": "GPUClass"})
    with pytest.raises(InvalidResourceError, match="apiVersion"):
        HeteroTrainJob.from_k8s({**minimal_job(), "apiVersion": "heterotrain.io/v1"})


# --- every invalid manifest is rejected in Python too, naming the field ----------------------------------


@pytest.mark.parametrize("case", INVALID_CASES, ids=[case["id"] for case in INVALID_CASES])
def test_invalid_manifest_is_rejected_naming_the_field(case: dict[str, Any]) -> None:
    with pytest.raises(InvalidResourceError) as raised:
        MODELS[case["manifest"]["kind"]].from_k8s(case["manifest"])
    assert case["field"] in str(raised.value)
    assert raised.value.name == case["manifest"]["metadata"]["name"]
    assert all(": " in problem for problem in raised.value.problems)


def test_cross_field_errors_tell_the_fix_and_the_values() -> None:
    with pytest.raises(InvalidResourceError) as raised:
        HeteroTrainJob.from_k8s(minimal_job(gpus={"min": 5, "max": 4}))
    (problem,) = raised.value.problems
    assert problem.startswith("spec.gpus.min: ")
    assert "lower gpus.min or raise gpus.max" in problem and "min=5, max=4" in problem


@pytest.mark.parametrize(
    ("location", "path"),
    [(("spec", "env", 0, "valueFrom"), "spec.env[0].valueFrom"), (("spec",), "spec"), ((), "")],
)
def test_field_path_uses_kubernetes_notation(location: tuple[int | str, ...], path: str) -> None:
    assert field_path(location) == path


@settings(max_examples=60, deadline=None)
@given(
    minimum=st.integers(1, 64),
    extra=st.integers(0, 64),
    global_batch=st.integers(1, 4096),
    strategy=st.sampled_from(list(Strategy)),
)
def test_valid_jobs_round_trip(minimum: int, extra: int, global_batch: int, strategy: Strategy) -> None:
    manifest = minimal_job(
        gpus={"min": minimum, "max": minimum + extra},
        batch={"global": max(global_batch, minimum), "min": minimum, "max": max(global_batch, minimum) * 2},
        parallelism={"strategy": strategy.value},
    )
    job = HeteroTrainJob.from_k8s(manifest)
    assert HeteroTrainJob.from_k8s(job.to_k8s()) == job
    assert job.spec.batch.lowest <= job.spec.batch.global_batch <= job.spec.batch.highest


# --- status ----------------------------------------------------------------------------------------------


def workers() -> list[WorkerAllocation]:
    return [
        WorkerAllocation(rank=2, node="gpu-slow-0", gpu_class="slow", gpus=1),
        WorkerAllocation(rank=0, node="gpu-fast-0", gpu_class="fast", gpus=2),
        WorkerAllocation(rank=1, node="gpu-fast-1", gpu_class="fast", gpus=1),
    ]


def test_allocation_summary_feeds_the_printer_columns() -> None:
    allocation = Allocation.from_workers(workers(), generation=1)
    assert [worker.rank for worker in allocation.workers] == [0, 1, 2]
    assert (allocation.total_gpus, allocation.classes, allocation.generation) == (4, "fast:3,slow:1", 1)
    assert summarise_classes([]) == ""


def test_allocation_ranks_must_be_dense() -> None:
    with pytest.raises(ValueError, match=r"allocation\.workers"):
        Allocation(workers=workers()[:1])  # rank 2 alone


def test_plan_local_batches_sum_to_the_global_batch() -> None:
    Plan(version=1, epoch=0, global_batch=7, local_batches=[4, 2, 1], predicted_iteration_seconds=0.5)
    with pytest.raises(ValueError, match=r"plan.localBatches must sum to plan.globalBatch \(6 != 7\)"):
        Plan(version=1, epoch=0, global_batch=7, local_batches=[4, 1, 1], predicted_iteration_seconds=0.5)


def test_rebalance_history_is_bounded_and_keeps_the_newest() -> None:
    status = HeteroTrainJobStatus(phase=Phase.RUNNING)
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    for version in range(MAX_REBALANCE_HISTORY + 5):
        record = RebalanceRecord(
            time=moment,
            epoch=version,
            from_version=version,
            to_version=version + 1,
            predicted_gain=0.1,
            predicted_iteration_seconds=1.0,
        )
        status = status.with_rebalance(record)
    assert len(status.rebalances) == MAX_REBALANCE_HISTORY
    assert status.rebalances[-1].to_version == MAX_REBALANCE_HISTORY + 5
    assert status.rebalances[0].to_version == 6


def test_condition_replaces_the_one_of_the_same_type() -> None:
    moment = datetime(2026, 1, 1, tzinfo=UTC)

    def condition(kind: str, state: ConditionStatus) -> Condition:
        return Condition(type=kind, status=state, last_transition_time=moment, reason="Because", message="")

    status = HeteroTrainJobStatus().with_condition(condition("Scheduled", ConditionStatus.FALSE))
    status = status.with_condition(condition("Ready", ConditionStatus.FALSE))
    status = status.with_condition(condition("Scheduled", ConditionStatus.TRUE))
    assert {c.type: c.status for c in status.conditions} == {"Ready": "False", "Scheduled": "True"}


def test_status_round_trips_with_rfc3339_times() -> None:
    status = HeteroTrainJobStatus(
        phase=Phase.RUNNING,
        allocation=Allocation.from_workers(workers()),
        plan=Plan(
            version=2, epoch=3, global_batch=7, local_batches=[4, 2, 1], predicted_iteration_seconds=0.5
        ),
        observed_generation=2,
    ).with_condition(
        Condition(
            type="Ready",
            status=ConditionStatus.TRUE,
            last_transition_time=datetime(2026, 1, 1, 12, 0, tzinfo=UTC),
            reason="WorkersRunning",
            message="3 of 3 workers running",
        )
    )
    job = HeteroTrainJob.from_k8s({**minimal_job(), "status": status.to_wire()})
    wire = job.to_k8s()["status"]
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert wire["allocation"]["totalGpus"] == 4
    assert wire["phase"] == "Running"
    assert job.status == status
