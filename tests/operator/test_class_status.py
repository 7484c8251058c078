"""GPUClass status: usable nodes, GPUs, free GPUs and the measured speed per class, counted by hand
here, and written at most once per interval per class."""

from __future__ import annotations

import asyncio

from tests.operator.builders import job_body, profile, put_profile
from tests.operator.inprocess import Cluster

from hetero_operator.controller.class_status import (
    MIN_INTERVAL_SECONDS,
    desired_statuses,
    status_patch,
    status_writes,
)
from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts
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


def gpu_class(name: str, product: str, prior: float = 1.0) -> ClassFacts:
    return ClassFacts(name, {PRODUCT: product}, "nvidia.com/gpu", prior, 16.0, 1.0, generation=2)


def measured_job(name: str, ms_per_sample: dict[str, float], phase: str = "Running") -> JobFacts:
    body = job_body(name=name)
    body["status"] = {"phase": phase, "measured": profile(ms_per_sample).to_wire()}
    return JobFacts.from_body(body)


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


def test_the_measured_speed_is_the_median_over_the_workloads_that_compared_the_class() -> None:
    view = ClusterView.build(
        [gpu_class("fast", "A100", prior=1.0), gpu_class("slow", "T4", prior=0.25), gpu_class("idle", "L4")],
        [node("a", "A100", 8), node("d", "T4", 2)],
        [measured_job("running", {"fast": 0.1, "slow": 0.1})],  # a job's own measurement is not the catalog
        [],
        profiles={
            # speeds 10 and 2 samples/ms: fast = 10/2 · 0.25 = 1.25, slow = 2/10 · 1.0 = 0.2
            "one": profile({"fast": 0.1, "slow": 0.5}),
            # speeds 4 and 2: fast = 4/2 · 0.25 = 0.5, slow = 2/4 · 1.0 = 0.5
            "two": profile({"fast": 0.25, "slow": 0.5}),
            "alone": profile({"slow": 0.1}),  # one class: no comparison
        },
    )
    statuses = desired_statuses(view)
    assert (statuses["fast"].measured_speed, statuses["fast"].measured_workloads) == (0.875, 2)
    assert (statuses["slow"].measured_speed, statuses["slow"].measured_workloads) == (0.35, 2)
    assert (statuses["idle"].measured_speed, statuses["idle"].measured_workloads) == (None, 0)


def test_a_patch_clears_a_measured_speed_that_no_job_backs_any_more() -> None:
    assert status_patch(GPUClassStatus(nodes=1, gpus=2, free_gpus=2)) == {
        "status": {
            "nodes": 1,
            "gpus": 2,
            "freeGpus": 2,
            "measuredWorkloads": 0,
            "measuredSpeed": None,
            "observedGeneration": None,
        }
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

        unmeasured = {"measuredWorkloads": 0}
        assert status("fast") == {"nodes": 1, "gpus": 2, "freeGpus": 2, **unmeasured}  # before the pods
        assert status("slow") == {"nodes": 1, "gpus": 4, "freeGpus": 4, **unmeasured}
        await cluster.cycle()  # the pods now hold 2 fast GPUs and 1 slow one: held by the interval
        assert status("fast")["freeGpus"] == 2
        cluster.clock.advance(MIN_INTERVAL_SECONDS)
        await cluster.cycle()
        assert (status("fast")["freeGpus"], status("slow")["freeGpus"]) == (0, 3)
        patches = cluster.kube.count("PATCH", "gpuclasses/fast/status")
        await cluster.cycle()
        assert cluster.kube.count("PATCH", "gpuclasses/fast/status") == patches  # nothing changed

    asyncio.run(scenario())


def test_the_loop_writes_the_measured_speed_and_clears_it_when_no_workload_backs_it() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 2), "slow-0": ("slow", 4)})
        # speeds 10 and 2 samples/ms: fast = 10/2 · 0.25 (slow's prior) = 1.25, slow = 2/10 · 1.0 = 0.2
        put_profile(cluster, "digits", {"fast": 0.1, "slow": 0.5})

        def status(name: str) -> dict[str, object]:
            found = cluster.kube.obj("GPUClass", "", name)
            assert found is not None
            return dict(found.get("status") or {})

        await cluster.cycle()
        assert (status("fast")["measuredSpeed"], status("fast")["measuredWorkloads"]) == (1.25, 1)
        assert (status("slow")["measuredSpeed"], status("slow")["measuredWorkloads"]) == (0.2, 1)
        cluster.kube.remove(("workloadprofiles", "", "digits"))
        cluster.advance(MIN_INTERVAL_SECONDS)
        await cluster.cycle()
        assert "measuredSpeed" not in status("fast") and status("fast")["measuredWorkloads"] == 0

    asyncio.run(scenario())
