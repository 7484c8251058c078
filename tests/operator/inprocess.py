"""The whole scheduling loop in process: the in-process Kubernetes, a clock the test moves, and the
real loop, cycle plan and writers on top."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.fakekube import FakeKube, ManualClock
from tests.operator.builders import job_body

from hetero_operator.controller.actions import CyclePlan
from hetero_operator.controller.kueue_step import KueueConfig
from hetero_operator.controller.lifecycle import LifecycleConfig
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.scheduling_loop import LoopConfig, SchedulingLoop
from hetero_operator.scheduler import SchedulerConfig

PRODUCT = "nvidia.com/gpu.product"
CLASSES = {"fast": ("A100", 1.0), "slow": ("T4", 0.25)}
GRACE = 30.0


def gpu_class(name: str, product: str, speed: float) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {PRODUCT: product},
            "resourceName": "nvidia.com/gpu",
            "memoryGiB": 16,
            "relativeSpeed": speed,
        },
    }


def node(name: str, product: str, gpus: int, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {PRODUCT: product}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": {"nvidia.com/gpu": str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class Cluster:
    """A FakeKube with GPU classes and nodes, and the loop over it."""

    def __init__(
        self,
        nodes: Mapping[str, tuple[str, int]],
        scheduler: SchedulerConfig | None = None,
        kueue: KueueConfig | None = None,
    ) -> None:
        self.kube = FakeKube()
        self.clock = ManualClock(self.kube.now)
        for name, (product, speed) in CLASSES.items():
            self.kube.put(gpu_class(name, product, speed))
        for name, (gpu_class_name, gpus) in nodes.items():
            self.kube.put(node(name, CLASSES[gpu_class_name][0], gpus))
        self.config = LoopConfig(
            lifecycle=LifecycleConfig(checkpoint_grace_seconds=GRACE),
            scheduler=scheduler or SchedulerConfig(),
            kueue=kueue,
        )
        self.loop = self.new_loop()

    def new_loop(self) -> SchedulingLoop:
        """A fresh operator (after a restart: nothing remembered, everything read again)."""
        return SchedulingLoop(self.kube, self.kube.indexes, self.config, OperatorMetrics(), clock=self.clock)

    def advance(self, seconds: float) -> None:
        """Move the operator's clock and the API server's together (creation times follow)."""
        self.clock.advance(seconds)
        self.kube.now = self.clock.now

    def submit(self, name: str, labels: Mapping[str, str] | None = None, **spec: Any) -> None:
        body = job_body(name, **spec)
        del body["metadata"]["uid"], body["metadata"]["generation"]
        if labels:
            body["metadata"]["labels"] = dict(labels)
        self.kube.put(body)

    async def cycle(self) -> CyclePlan:
        """One cycle and every write it queued (call inside a running event loop)."""
        plan = self.loop.cycle()
        await self.loop.settle()
        return plan

    def status(self, name: str) -> dict[str, Any]:
        found = self.kube.obj("HeteroTrainJob", "team", name)
        assert found is not None
        return dict(found.get("status") or {})

    def condition(self, name: str, kind: str) -> dict[str, Any]:
        return next(c for c in self.status(name)["conditions"] if c["type"] == kind)

    def pods(self, job: str) -> dict[str, dict[str, Any]]:
        return {
            p["metadata"]["name"]: p
            for p in self.kube.of_kind("Pod", "team")
            if p["metadata"]["labels"].get("heterotrain.io/job") == job
        }

    def run_pods(self, job: str, phase: str = "Running", exit_code: int | None = None) -> None:
        for name in self.pods(job):
            self.kube.set_pod("team", name, phase, exit_code)

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.kube.of_kind("Event", "team") if e["reason"] == reason]
