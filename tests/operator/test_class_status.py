"""GPUClass status: usable nodes, GPUs and free GPUs per class, counted by hand here, and written at
most once per interval per class."""

from __future__ import annotations

import asyncio

from tests.operator.inprocess import Cluster

from hetero_operator.controller.class_status import MIN_INTERVAL_SECONDS, desired_statuses, status_writes
from hetero_operator.controller.facts import ClassFacts, NodeFacts
from hetero_operator.controller.inventory import ClusterView
from hetero_operator.resources import GPUClassStatus

PRODUCT = "nvidia.com/gpu.product"


def node(name: str, product: str, gpus: int, ready: bool = True, taint: bool = False) -> NodeFacts:
    return NodeFacts.from_body(
        {
            "metadata": {"name": name, "labels": {PRODUCT: product}},
            "spec": {"taints": [{"key": "maintenance", "effect": "NoSchedule"}] if taint else []},
            "status": {
                "allocatable": {"nvidia.com/gpu": str(gpus)},
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
    )


def gpu_class(name: str, product: str) -> ClassFacts:
    return ClassFacts(name, {PRODUCT: product}, "nvidia.com/gpu", 1.0, 16.0, 1.0, generation=2)


def test_only_ready_untainted_nodes_count() -> None:
    view = ClusterView.build(
        [gpu_class("fast", "A100"), gpu_class("slow", "T4"), gpu_class("none", "H100")],
        [
            node("a", "A100", 8),
            node("b", "A100", 8, ready=False),
            node("c", "A100", 4, taint=True),
            node("d", "T4", 2),
        ],
        [],
        [],
    )
    assert desired_statuses(view) == {
        "fast": GPUClassStatus(nodes=1, gpus=8, free_gpus=8, observed_generation=2),
        "slow": GPUClassStatus(nodes=1, gpus=2, free_gpus=2, observed_generation=2),
        "none": GPUClassStatus(nodes=0, gpus=0, free_gpus=0, observed_generation=2),
    }


def test_a_change_waits_for_the_class_interval_and_equal_statuses_are_not_written() -> None:
    old, new = GPUClassStatus(nodes=1, gpus=8, free_gpus=8), GPUClassStatus(nodes=1, gpus=8, free_gpus=2)
    assert status_writes({"a": new}, {"a": new}, {}, {}, 100.0).due == {}  # the class says so already
    assert status_writes({"a": new}, {"a": old}, {"a": new}, {"a": 0.0}, 100.0).due == {}  # on its way
    held = status_writes({"a": new}, {"a": old}, {"a": old}, {"a": 99.0}, 100.0)
    assert held.due == {} and held.wake_in == MIN_INTERVAL_SECONDS - 1.0
    assert status_writes({"a": new}, {"a": old}, {"a": old}, {"a": 95.0}, 100.0).due == {"a": new}
    assert status_writes({"a": new}, {"a": None}, {}, {}, 100.0).due == {"a": new}  # never written


def test_the_loop_reports_placements_in_the_class_status() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 2), "slow-0": ("slow", 4)})
        cluster.submit("train", gpus={"min": 3, "max": 3}, batch={"global": 60})
        await cluster.cycle()

        def status(name: str) -> dict[str, int]:
            found = cluster.kube.obj("GPUClass", "", name)
            assert found is not None
            return dict(found.get("status") or {})

        assert status("fast") == {"nodes": 1, "gpus": 2, "freeGpus": 2}  # before the pods existed
        assert status("slow") == {"nodes": 1, "gpus": 4, "freeGpus": 4}
        await cluster.cycle()  # the pods now hold 2 fast GPUs and 1 slow one: held by the interval
        assert status("fast")["freeGpus"] == 2
        cluster.clock.advance(MIN_INTERVAL_SECONDS)
        await cluster.cycle()
        assert (status("fast")["freeGpus"], status("slow")["freeGpus"]) == (0, 3)
        patches = cluster.kube.count("PATCH", "gpuclasses/fast/status")
        await cluster.cycle()
        assert cluster.kube.count("PATCH", "gpuclasses/fast/status") == patches  # nothing changed

    asyncio.run(scenario())
