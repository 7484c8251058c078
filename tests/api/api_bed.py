"""The test pool, jobs and RBAC objects the API and CLI tests share (builders only, no fixtures)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from api_cases import job_spec
from fastapi import FastAPI

from hetero_operator.api import serve
from hetero_operator.resources import (
    Allocation,
    Condition,
    ConditionStatus,
    HeteroTrainJobStatus,
    Phase,
    Plan,
    Progress,
    RebalanceRecord,
    WorkerAllocation,
)
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import GPU_CLASS_LABEL, KWOK_TAINT_KEY

KWOK_TOLERATION = {"key": KWOK_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
STARTED = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class ApiBed:
    testbed: Testbed
    prefix: str
    namespace: str
    fast: str
    slow: str
    local_class: str
    reader_token: str = field(repr=False)
    outsider_token: str = field(repr=False)

    def node(self, role: str) -> str:
        return f"{self.prefix}-{role}"


def gpu_class_object(name: str, speed: float, memory: int) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {GPU_CLASS_LABEL: name},
            "memoryGiB": memory,
            "relativeSpeed": speed,
            "tolerations": [KWOK_TOLERATION],
        },
    }


def running_status(bed: ApiBed) -> HeteroTrainJobStatus:
    workers = [
        WorkerAllocation(rank=r, node=bed.node("fast-0"), gpu_class=bed.fast, gpus=1) for r in range(4)
    ]
    return HeteroTrainJobStatus(
        phase=Phase.RUNNING,
        allocation=Allocation.from_workers(workers),
        plan=Plan(
            version=2,
            epoch=1,
            global_batch=128,
            local_batches=[32, 32, 32, 32],
            predicted_iteration_seconds=0.2,
            measured_iteration_seconds=0.25,
        ),
        progress=Progress(epoch=1, samples_per_second=512.0, eta_seconds=40.0),
        rebalances=[
            RebalanceRecord(
                time=STARTED,
                epoch=1,
                from_version=1,
                to_version=2,
                predicted_gain=0.125,
                predicted_iteration_seconds=0.2,
                measured_iteration_seconds=0.25,
                reason="MeasuredSpeeds",
            )
        ],
        conditions=[
            Condition(
                type="Placed",
                status=ConditionStatus.TRUE,
                reason="Placed",
                message=f"4 GPUs ({bed.fast}:4) on 1 nodes",
                last_transition_time=STARTED,
            )
        ],
        restarts=1,
    )


QUEUED_MESSAGE = "needs 4 GPUs at once (gpus.min); waiting for the test"


def queued_status() -> HeteroTrainJobStatus:
    waiting = Condition(
        type="Placed",
        status=ConditionStatus.FALSE,
        reason="WaitingForGPUs",
        message=QUEUED_MESSAGE,
        last_transition_time=STARTED,
    )
    return HeteroTrainJobStatus(phase=Phase.QUEUED, conditions=[waiting])


def job_object(bed: ApiBed, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": bed.namespace},
        "spec": job_spec(4, 4, [bed.fast, bed.slow]),
    }


def rbac_objects(prefix: str, namespace: str) -> list[dict[str, Any]]:
    reader = {"kind": "ServiceAccount", "name": "reader", "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": namespace}}
        for n in ("reader", "outsider")
    ] + [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "htj-reader", "namespace": namespace},
            "rules": [
                {"apiGroups": ["heterotrain.io"], "resources": ["heterotrainjobs"], "verbs": ["get", "list"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "htj-reader", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "htj-reader"},
            "subjects": [reader],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{prefix}-gpuclass-reader"},
            "rules": [
                {
                    "apiGroups": ["heterotrain.io"],
                    "resources": ["gpuclasses", "workloadprofiles"],
                    "verbs": ["list"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{prefix}-gpuclass-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{prefix}-gpuclass-reader",
            },
            "subjects": [reader],
        },
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """``app`` served over real HTTP by `serve()`, in a thread with its own event loop, until the block ends
    (then `serve()` must stop within seconds of being cancelled)."""
    port = free_port()
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(app, "127.0.0.1", port))

    def run() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        time.sleep(0.1)
    else:
        raise AssertionError("the API did not start within 30 s")
    try:
        yield url
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=15)
        assert not thread.is_alive(), "serve() must stop when cancelled"
