"""The Workload a HeteroTrainJob gets: pod sets per GPU class, owner, queue, priority, name."""

from __future__ import annotations

from typing import Any

import pytest
from tests.operator.builders import job_body

from hetero_operator.kueue.workload import (
    ClassShare,
    ProposedMix,
    WorkloadPriorityClass,
    WorkloadSpecError,
    build_workload,
    queue_name,
    workload_name,
)
from hetero_operator.resources import GPUClassSpec, HeteroTrainJob

T4_TAINT = {"key": "gpu", "operator": "Equal", "value": "t4", "effect": "NoSchedule"}
CLASSES = {
    "fast": GPUClassSpec.model_validate(
        {"nodeSelector": {"nvidia.com/gpu.product": "A100"}, "memoryGiB": 80, "relativeSpeed": 1.0}
    ),
    "slow": GPUClassSpec.model_validate(
        {
            "nodeSelector": {"nvidia.com/gpu.product": "T4", "zone": "b"},
            "resourceName": "example.com/t4",
            "memoryGiB": 16,
            "relativeSpeed": 0.25,
            "tolerations": [T4_TAINT],
        }
    ),
}


def make_job(
    name: str = "train",
    uid: str = "uid-1",
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> HeteroTrainJob:
    body = job_body(name, **spec)
    body["metadata"]["uid"] = uid
    body["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-queue"} if labels is None else labels
    return HeteroTrainJob.from_k8s(body)


def test_one_pod_set_per_class_with_its_count_requests_and_node_selector() -> None:
    workload = build_workload(make_job(), ProposedMix.of({"fast": 3, "slow": 2}), CLASSES)
    pod_sets = workload["spec"]["podSets"]
    assert [(p["name"], p["count"]) for p in pod_sets] == [("fast", 3), ("slow", 2)]
    fast, slow = (p["template"]["spec"] for p in pod_sets)
    assert fast["nodeSelector"] == {"nvidia.com/gpu.product": "A100"}
    assert slow["nodeSelector"] == {"nvidia.com/gpu.product": "T4", "zone": "b"}
    assert fast["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "1"}
    assert slow["containers"][0]["resources"]["requests"] == {"example.com/t4": "1"}
    assert slow["containers"][0]["resources"]["limits"] == {"example.com/t4": "1"}
    assert slow["tolerations"] == [T4_TAINT]
    assert "tolerations" not in fast
    assert fast["containers"][0]["image"] == "heterotrain/trainer:test"


def test_gpus_per_worker_sets_each_pods_request() -> None:
    mix = ProposedMix((ClassShare("fast", workers=2, gpus_per_worker=4),))
    workload = build_workload(make_job(), mix, CLASSES)
    (pod_set,) = workload["spec"]["podSets"]
    assert pod_set["count"] == 2
    assert pod_set["template"]["spec"]["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu": "4"}
    assert mix.total_gpus == 8


def test_the_job_template_reaches_the_pod_sets() -> None:
    extra = {"key": "team", "operator": "Exists", "effect": "NoSchedule"}
    job = make_job(template={"spec": {"tolerations": [extra], "priorityClassName": "training"}})
    workload = build_workload(job, ProposedMix.of({"slow": 1}), CLASSES)
    template = workload["spec"]["podSets"][0]["template"]["spec"]
    assert template["tolerations"] == [T4_TAINT, extra]
    assert template["priorityClassName"] == "training"


def test_the_job_owns_it_as_controller_and_names_its_queue() -> None:
    workload = build_workload(make_job(uid="abc-123"), ProposedMix.of({"fast": 1}), CLASSES)
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert workload["kind"] == "Workload"
    assert workload["metadata"]["namespace"] == "team"
    (owner,) = workload["metadata"]["ownerReferences"]
    assert owner == {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "name": "train",
        "uid": "abc-123",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/job-uid"] == "abc-123"
    assert workload["spec"]["queueName"] == "team-queue"


def test_priority_comes_from_the_job_or_a_workload_priority_class() -> None:
    mix = ProposedMix.of({"fast": 1})
    plain = build_workload(make_job(priority=7), mix, CLASSES)
    assert plain["spec"]["priority"] == 7
    assert "priorityClassRef" not in plain["spec"]
    classed = build_workload(make_job(priority=7), mix, CLASSES, WorkloadPriorityClass("urgent", 1000))
    assert classed["spec"]["priority"] == 1000
    assert classed["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "urgent",
    }


@pytest.mark.parametrize(("suspend", "active"), [(False, True), (True, False)])
def test_suspend_maps_to_active(suspend: bool, active: bool) -> None:
    workload = build_workload(make_job(suspend=suspend), ProposedMix.of({"fast": 1}), CLASSES)
    assert workload["spec"]["active"] is active


def test_the_name_is_stable_per_job_and_mix_and_differs_otherwise() -> None:
    job = make_job()
    mix = ProposedMix.of({"fast": 3, "slow": 2})
    same_mix_other_order = ProposedMix.of({"slow": 2, "fast": 3})
    names = {
        workload_name(job, mix),
        workload_name(job, same_mix_other_order),
    }
    assert len(names) == 1
    (name,) = names
    assert name.startswith("train-") and len(name) == len("train-") + 8
    assert workload_name(job, ProposedMix.of({"fast": 2, "slow": 2})) != name
    assert workload_name(make_job(uid="uid-2"), mix) != name
    assert build_workload(job, mix, CLASSES)["metadata"]["name"] == name


def test_a_52_character_job_name_gives_a_valid_workload_name() -> None:
    name = workload_name(make_job(name="j" * 52), ProposedMix.of({"fast": 1}))
    assert len(name) <= 63


def test_queue_name_is_none_without_the_label() -> None:
    assert queue_name(make_job(labels={})) is None
    assert queue_name(make_job()) == "team-queue"


def test_an_unlabelled_job_is_refused_with_the_label_to_set() -> None:
    with pytest.raises(WorkloadSpecError, match=r"kueue\.x-k8s\.io/queue-name"):
        build_workload(make_job(labels={}), ProposedMix.of({"fast": 1}), CLASSES)


def test_a_job_without_uid_is_refused() -> None:
    with pytest.raises(WorkloadSpecError, match=r"metadata\.uid"):
        build_workload(make_job(uid=""), ProposedMix.of({"fast": 1}), CLASSES)


def test_a_class_without_gpuclass_is_named() -> None:
    with pytest.raises(WorkloadSpecError, match="no GPUClass: medium"):
        build_workload(make_job(), ProposedMix.of({"fast": 1, "medium": 2}), CLASSES)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ClassShare("a.b", 1), "DNS"),
        (lambda: ClassShare("x" * 64, 1), "at most 63"),
        (lambda: ClassShare("fast", 0), "workers of class 'fast' must be >= 1"),
        (lambda: ClassShare("fast", 1, 0), "gpusPerWorker"),
        (lambda: ProposedMix(()), "at least one"),
        (lambda: ProposedMix((ClassShare("fast", 1), ClassShare("fast", 2))), "repeated: fast"),
        (lambda: ProposedMix.of({f"c{i}": 1 for i in range(19)}), "18 pod sets"),
    ],
)
def test_bad_mixes_are_refused_with_the_reason(build: Any, message: str) -> None:
    with pytest.raises(WorkloadSpecError, match=message):
        build()


def test_eighteen_classes_fit() -> None:
    mix = ProposedMix.of({f"c{i}": 1 for i in range(18)})
    classes = dict.fromkeys((s.gpu_class for s in mix.shares), CLASSES["fast"])
    assert len(build_workload(make_job(), mix, classes)["spec"]["podSets"]) == 18
