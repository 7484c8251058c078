"""Checkpoint storage a cluster can provide: the claim the operator creates (storage class, access
mode, size from the spec over the operator's defaults), an existing claim, and ReadWriteOnce volumes
mounted on rank 0 only."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from tests.operator.builders import allocation, job

from hetero_operator import plan as contract
from hetero_operator.controller import launcher
from hetero_operator.controller.plans import initial_plan
from hetero_operator.controller.validation import semantic_problems
from hetero_operator.resources import CheckpointAccessMode, InvalidResourceError

DEFAULTS = launcher.LaunchSettings()
THREE_WORKERS = allocation(("node-a", "fast"), ("node-b", "medium"), ("node-c", "slow"))


def claim_volumes(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in pod["spec"]["volumes"] if "persistentVolumeClaim" in v]


def mount_paths(pod: dict[str, Any]) -> list[str]:
    return [m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]]


def env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_default_claim_is_shared_by_every_worker_with_the_cluster_default_class() -> None:
    model = job(checkpoint={"path": "/ckpt"})
    claim = launcher.checkpoint_claim(model, DEFAULTS)
    assert claim is not None
    assert claim["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}}
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "HeteroTrainJob"  # deleted with the job
    pods = launcher.worker_pods(model, THREE_WORKERS, DEFAULTS)
    for pod in pods:
        assert claim_volumes(pod) == [
            {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "train-checkpoint"}}
        ]
        assert "/ckpt" in mount_paths(pod)
        assert contract.CHECKPOINT_RANK0_ONLY_ENV not in env_names(pod)


def test_operator_defaults_apply_where_the_spec_is_silent() -> None:
    settings = launcher.LaunchSettings(
        checkpoint_storage="200Gi",
        checkpoint_storage_class="fast-nfs",
        checkpoint_access_mode=CheckpointAccessMode.READ_WRITE_ONCE,
    )
    claim = launcher.checkpoint_claim(job(checkpoint={"path": "/ckpt"}), settings)
    assert claim is not None
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "200Gi"}},
        "storageClassName": "fast-nfs",
    }


def test_spec_storage_overrides_the_operator_defaults() -> None:
    settings = launcher.LaunchSettings(checkpoint_storage_class="fast-nfs")
    storage = {"storageClassName": "premium-rwo", "accessMode": "ReadWriteOnce", "size": "50Gi"}
    claim = launcher.checkpoint_claim(job(checkpoint={"path": "/ckpt", "storage": storage}), settings)
    assert claim is not None
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "50Gi"}},
        "storageClassName": "premium-rwo",
    }


def test_read_write_once_is_mounted_and_written_by_rank_0_only() -> None:
    model = job(
        gpus={"min": 3, "max": 3}, checkpoint={"path": "/ckpt", "storage": {"accessMode": "ReadWriteOnce"}}
    )
    first, second, third = launcher.worker_pods(model, THREE_WORKERS, DEFAULTS)
    assert [len(claim_volumes(pod)) for pod in (first, second, third)] == [1, 0, 0]
    assert "/ckpt" in mount_paths(first)
    assert "/ckpt" not in mount_paths(second) and "/ckpt" not in mount_paths(third)
    for pod in (first, second, third):
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env[contract.CHECKPOINT_RANK0_ONLY_ENV] == "1"
        assert env[contract.CHECKPOINT_DIR_ENV] == "/ckpt"
    plan = initial_plan(model.spec, THREE_WORKERS, {"fast": 1.0, "medium": 0.5, "slow": 0.25})
    for manifest in launcher.generation_manifests(model, THREE_WORKERS, plan, DEFAULTS):
        kubernetes_validate.validate(manifest, "1.36", strict=True)


def test_existing_claim_is_mounted_and_never_created() -> None:
    model = job(checkpoint={"path": "/ckpt", "storage": {"existingClaim": "team-checkpoints"}})
    assert launcher.checkpoint_claim(model, DEFAULTS) is None
    plan = initial_plan(model.spec, THREE_WORKERS, {"fast": 1.0, "medium": 0.5, "slow": 0.25})
    manifests = launcher.generation_manifests(model, THREE_WORKERS, plan, DEFAULTS)
    assert "PersistentVolumeClaim" not in {m["kind"] for m in manifests}
    for pod in (m for m in manifests if m["kind"] == "Pod"):
        assert claim_volumes(pod) == [
            {"name": "checkpoint", "persistentVolumeClaim": {"claimName": "team-checkpoints"}}
        ]


def test_existing_read_write_once_claim_is_mounted_on_rank_0_only() -> None:
    storage = {"existingClaim": "team-checkpoints", "accessMode": "ReadWriteOnce"}
    pods = launcher.worker_pods(
        job(checkpoint={"path": "/ckpt", "storage": storage}), THREE_WORKERS, DEFAULTS
    )
    assert [len(claim_volumes(pod)) for pod in pods] == [1, 0, 0]


@pytest.mark.parametrize(
    ("checkpoint", "field", "fix"),
    [
        (
            {"path": "/ckpt", "storage": {"existingClaim": "mine", "size": "5Gi"}},
            "spec.checkpoint.storage",
            "checkpoint.storage.size describes a claim the operator creates",
        ),
        (
            {"path": "/ckpt", "storage": {"existingClaim": "mine", "storageClassName": "nfs"}},
            "spec.checkpoint.storage",
            "checkpoint.storage.storageClassName describes a claim the operator creates",
        ),
        (
            {"path": "s3://bucket/run", "storage": {"size": "5Gi"}},
            "spec.checkpoint",
            "make the path absolute or remove checkpoint.storage",
        ),
        (
            {"path": "/ckpt", "storage": {"accessMode": "ReadOnlyMany"}},
            "spec.checkpoint.storage.accessMode",
            "ReadWriteMany",
        ),
    ],
)
def test_bad_storage_is_refused_naming_the_field_and_the_fix(
    checkpoint: dict[str, Any], field: str, fix: str
) -> None:
    with pytest.raises(InvalidResourceError) as refused:
        job(checkpoint=checkpoint)
    text = "\n".join(refused.value.problems)
    assert field in text and fix in text, text


def test_existing_claim_may_not_take_the_name_the_operator_deletes_with_the_job() -> None:
    problems = semantic_problems(
        job(checkpoint={"path": "/ckpt", "storage": {"existingClaim": "train-checkpoint"}})
    )
    assert any(p.startswith("spec.checkpoint.storage.existingClaim: 'train-checkpoint'") for p in problems)
    assert semantic_problems(job(checkpoint={"path": "/ckpt", "storage": {"existingClaim": "shared"}})) == []
