"""Kueue's side of the Workload handshake, played by the test on the in-process API server, so the
operator's loop can be driven through admission, eviction and release one step at a time.

It writes what tests/kueue/test_kueue_live.py saw the real Kueue v0.19.2 write (conditions, the
admission, the ClusterQueue's usage), with Kueue's field manager. The real Kueue is tested against
in tests/kueue/test_kueue_operator_live.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from tests.fakekube import FakeKube
from tests.operator.inprocess import CLASSES, Cluster, gpu_class

from hetero_operator.controller.k8s import path_of
from hetero_operator.kueue import constants, queues
from hetero_operator.resources import GPUClass

GPU = "nvidia.com/gpu"
QUEUE = "team"
CLUSTER_QUEUE = "gpus"
LABELS = {constants.QUEUE_NAME_LABEL: QUEUE}


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _condition(kind: str, status: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": _stamp(now),
    }


class PlayedKueue:
    """One ResourceFlavor per GPU class (named after it), a ClusterQueue with `quotas` and a
    LocalQueue in the jobs' namespace."""

    def __init__(self, cluster: Cluster, quotas: Mapping[str, int]) -> None:
        self.cluster = cluster
        self.kube: FakeKube = cluster.kube
        for name, (product, speed) in CLASSES.items():
            spec = GPUClass.from_k8s(gpu_class(name, product, speed)).spec
            self.kube.put(queues.resource_flavor(name, spec))
        self.kube.put(queues.cluster_queue(CLUSTER_QUEUE, GPU, quotas, preempt_lower_priority=True))
        self.kube.put(queues.local_queue(QUEUE, "team", CLUSTER_QUEUE))
        self.usage: dict[str, int] = {}

    @property
    def now(self) -> float:
        return self.cluster.clock.now

    def workloads(self, job: str | None = None) -> list[dict[str, Any]]:
        return [
            w
            for w in self.kube.of_kind("Workload", "team")
            if job is None or w["metadata"]["labels"]["heterotrain.io/job"] == job
        ]

    def only(self, job: str) -> dict[str, Any]:
        found = self.workloads(job)
        assert len(found) == 1, [w["metadata"]["name"] for w in found]
        return found[0]

    def mix(self, job: str) -> dict[str, int]:
        return {p["name"]: p["count"] for p in self.only(job)["spec"]["podSets"]}

    def conditions(self, name: str) -> dict[str, dict[str, Any]]:
        body = self.kube.obj("Workload", "team", name)
        assert body is not None
        return {c["type"]: c for c in (body.get("status") or {}).get("conditions") or []}

    async def _apply(self, name: str, status: dict[str, Any]) -> None:
        body = {"apiVersion": constants.API_VERSION, "kind": "Workload", "status": status}
        path = path_of("Workload", "team", name, "status")
        await self.kube.apply(path, body, constants.ADMISSION_FIELD_MANAGER)

    def _set_usage(self, flavor: str, gpus: int) -> None:
        self.usage[flavor] = self.usage.get(flavor, 0) + gpus
        key = ("clusterqueues", "", CLUSTER_QUEUE)
        body = self.kube.objects[key]
        used = [{"name": f, "resources": [{"name": GPU, "total": str(n)}]} for f, n in self.usage.items()]
        body["status"] = {"flavorsUsage": used}
        self.kube._store(key, body)

    async def pending(self, name: str, message: str) -> None:
        await self._apply(
            name, {"conditions": [_condition("QuotaReserved", False, "Pending", message, self.now)]}
        )

    async def admit(self, name: str) -> None:
        """Reserve and admit every pod set on the flavor named after its class."""
        body = self.kube.obj("Workload", "team", name)
        assert body is not None
        assignments = [
            {"name": p["name"], "flavors": {GPU: p["name"]}, "count": p["count"]}
            for p in body["spec"]["podSets"]
        ]
        for assignment in assignments:
            self._set_usage(assignment["name"], assignment["count"])
        conditions = [
            _condition(
                "QuotaReserved",
                True,
                "QuotaReserved",
                f"Quota reserved in ClusterQueue {CLUSTER_QUEUE}",
                self.now,
            ),
            _condition("Admitted", True, "Admitted", "The workload is admitted", self.now),
        ]
        admission = {"clusterQueue": CLUSTER_QUEUE, "podSetAssignments": assignments}
        await self._apply(name, {"conditions": conditions, "admission": admission})

    async def evict(self, name: str, reason: str, message: str) -> None:
        """Evicted=True, keeping the admission (and the quota) until the job hands it back."""
        status = dict((self.kube.obj("Workload", "team", name) or {}).get("status") or {})
        conditions = [c for c in status.get("conditions", []) if c["type"] not in ("Evicted", "Preempted")]
        conditions.append(_condition("Evicted", True, reason, message, self.now))
        if reason == "Preempted":
            conditions.append(_condition("Preempted", True, "InClusterQueue", message, self.now))
        await self._apply(name, {**status, "conditions": conditions})

    def release_usage(self, name: str) -> None:
        """What Kueue does once an admission is handed back or a Workload finishes."""
        for pod_set in (self.kube.obj("Workload", "team", name) or {})["spec"]["podSets"]:
            self._set_usage(pod_set["name"], -pod_set["count"])
