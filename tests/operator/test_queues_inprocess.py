"""HeteroQueues through the whole scheduling loop, in process: quotas hold, a job naming no queue
waits naming spec.queue, and each queue's status counts what its jobs hold."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.operator.inprocess import Cluster


def heteroqueue(name: str, fast: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroQueue",
        "metadata": {"name": name},
        "spec": {"quotas": [{"gpuClass": "fast", "nominal": fast}], **spec},
    }


def test_quotas_hold_unknown_queues_wait_and_the_status_counts_usage() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 4)})
        cluster.kube.put(heteroqueue("team-a", 2))
        cluster.submit("a1", gpus={"min": 2, "max": 2}, gpuClasses=["fast"], queue="team-a")
        cluster.advance(1)
        cluster.submit("a2", gpus={"min": 1, "max": 1}, gpuClasses=["fast"], queue="team-a")
        cluster.submit("stray", gpus={"min": 1, "max": 1}, queue="nowhere")
        await cluster.cycle()
        assert cluster.status("a1")["phase"] == "Starting"
        # a2 would fit the free GPUs but not the queue's quota of 2 fast GPUs.
        placed = cluster.condition("a2", "Placed")
        assert (placed["status"], placed["reason"]) == ("False", "QuotaExceeded")
        assert "queue team-a may take only class fast: 0 GPUs more" in placed["message"]
        stray = cluster.condition("stray", "Placed")
        assert stray["reason"] == "UnknownQueue" and "spec.queue" in stray["message"]
        queue = cluster.kube.obj("HeteroQueue", "", "team-a")
        assert queue is not None
        status = queue["status"]
        assert status["usage"] == [{"gpuClass": "fast", "gpus": 2, "nominal": 2, "borrowed": 0}]
        assert status["summary"] == "fast 2/2"
        assert (status["runningJobs"], status["pendingJobs"]) == (1, 1)

    asyncio.run(scenario())
