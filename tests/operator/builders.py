"""Small builders of jobs, allocations and pods shared by the operator's pure tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from hetero_operator.controller.catalog import observe
from hetero_operator.controller.facts import PodFacts
from hetero_operator.resources import (
    Allocation,
    HeteroTrainJob,
    HeteroTrainJobStatus,
    MeasuredClass,
    MeasuredProfile,
    WorkerAllocation,
)

if TYPE_CHECKING:
    from tests.operator.inprocess import Cluster

TOLERATE_KWOK = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def job_body(name: str = "train", namespace: str = "team", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "image": "heterotrain/trainer:test",
        "command": ["heterotrain", "worker"],
        "gpus": {"min": 2, "max": 2},
        "batch": {"global": 64},
        "epochs": 3,
    }
    base.update(spec)
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": namespace, "uid": "uid-1", "generation": 1},
        "spec": base,
    }


def job(status: HeteroTrainJobStatus | None = None, **spec: Any) -> HeteroTrainJob:
    model = HeteroTrainJob.from_k8s(job_body(**spec))
    return model.model_copy(update={"status": status})


def allocation(*placements: tuple[str, str], generation: int = 0) -> Allocation:
    """allocation(("node-a", "fast"), ("node-b", "slow")): one single-GPU worker per pair, in rank order."""
    workers = [
        WorkerAllocation(rank=rank, node=node, gpu_class=gpu_class, gpus=1)
        for rank, (node, gpu_class) in enumerate(placements)
    ]
    return Allocation.from_workers(workers, generation=generation)


def pod(
    name: str,
    phase: str = "Running",
    node: str = "node-a",
    job_name: str | None = "train",
    generation: int | None = 0,
    rank: int | None = 0,
    gpus: int = 1,
    **extra: Any,
) -> PodFacts:
    return PodFacts(
        namespace="team",
        name=name,
        node=node,
        phase=phase,
        resources={"nvidia.com/gpu": gpus},
        job=job_name,
        generation=generation,
        rank=rank,
        **extra,
    )


def put_profile(cluster: Cluster, key: str, ms: dict[str, float]) -> None:
    """A WorkloadProfile for `key` in the in-process cluster, as one earlier job measured it now."""
    status = observe(None, "team/earlier", profile(ms), datetime.fromtimestamp(cluster.clock.now, UTC))
    cluster.kube.put(
        {
            "apiVersion": "heterotrain.io/v1alpha1",
            "kind": "WorkloadProfile",
            "metadata": {"name": key},
            "spec": {"workload": key},
            "status": status.to_wire(),
        }
    )


def profile(ms_per_sample: dict[str, float]) -> MeasuredProfile:
    return MeasuredProfile(
        classes=[
            MeasuredClass(
                gpu_class=name,
                compute_ms_per_sample=ms,
                compute_fixed_ms=3.0,
                sync_ready_ms_per_sample=ms / 2,
                sync_ready_fixed_ms=1.0,
                workers=1,
            )
            for name, ms in ms_per_sample.items()
        ],
        overlapped_allreduce_ms=5.0,
        last_bucket_allreduce_ms=1.0,
        plan_version=2,
    )
