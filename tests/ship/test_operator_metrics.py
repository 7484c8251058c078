"""The operator's gauges behind the dashboards' capacity and predicted-step panels: what they count and
which series they keep."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from hetero_operator import metric_names as names
from hetero_operator.controller.facts import ClassFacts, NodeFacts, PodFacts, Taint
from hetero_operator.controller.inventory import ClassCapacity, ClusterView, gpu_capacity
from hetero_operator.controller.metrics import OperatorMetrics

GPU = "nvidia.com/gpu"
LABEL = "nvidia.com/gpu.product"


def gpu_class(name: str, tolerations: tuple[dict[str, str], ...] = ()) -> ClassFacts:
    return ClassFacts(name, {LABEL: name}, GPU, 1.0, 80.0, 1.0, tolerations)


def node(name: str, product: str, gpus: int, ready: bool = True, cordoned: bool = False) -> NodeFacts:
    return NodeFacts(name, {LABEL: product}, {GPU: gpus}, ready, cordoned)


def pod(name: str, node_name: str | None, gpus: int, phase: str = "Running") -> PodFacts:
    return PodFacts("team", name, node_name, phase, {GPU: gpus}, job="train" if gpus else None)


def test_capacity_counts_ready_schedulable_nodes_and_frees_what_no_live_pod_requests() -> None:
    tainted = NodeFacts("a100-3", {LABEL: "a100"}, {GPU: 8}, True, False, (Taint("maint", "", "NoSchedule"),))
    view = ClusterView.build(
        classes=[gpu_class("a100"), gpu_class("t4"), gpu_class("l4")],
        nodes=[
            node("a100-1", "a100", 8),
            node("a100-2", "a100", 8, ready=False),  # NotReady: not capacity
            tainted,  # a taint its class does not tolerate: not capacity
            node("t4-1", "t4", 4),
            node("t4-2", "t4", 4, cordoned=True),  # cordoned: not capacity
            node("cpu-1", "none", 0),  # of no class
        ],
        jobs=[],
        pods=[
            pod("w0", "a100-1", 3),
            pod("w1", "a100-1", 2, phase="Succeeded"),  # finished: holds nothing
            pod("other", "t4-1", 6),  # more than the node has: free stops at zero
            pod("pending", None, 1),
            pod("on-notready", "a100-2", 8),
        ],
    )
    assert gpu_capacity(view) == {
        "a100": ClassCapacity(total=8, free=5),
        "l4": ClassCapacity(total=0, free=0),  # a class without nodes is listed, at zero
        "t4": ClassCapacity(total=4, free=0),
    }


def test_a_tolerated_taint_keeps_the_node_in_capacity() -> None:
    tolerant = gpu_class("a100", ({"key": "maint", "operator": "Exists"},))
    tainted = NodeFacts("a100-1", {LABEL: "a100"}, {GPU: 8}, True, False, (Taint("maint", "", "NoSchedule"),))
    view = ClusterView.build([tolerant], [tainted], [], [])
    assert gpu_capacity(view) == {"a100": ClassCapacity(total=8, free=8)}


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, labels)


def series(registry: CollectorRegistry, metric: str) -> list[dict[str, str]]:
    return [dict(s.labels) for family in registry.collect() if family.name == metric for s in family.samples]


def test_capacity_gauges_replace_classes_that_vanished() -> None:
    metrics = OperatorMetrics()
    metrics.set_gpu_capacity({"a100": ClassCapacity(16, 4), "t4": ClassCapacity(8, 8)})
    assert sample(metrics.registry, names.OPERATOR_GPUS_CAPACITY, gpu_class="a100") == 16
    assert sample(metrics.registry, names.OPERATOR_GPUS_FREE, gpu_class="a100") == 4
    metrics.set_gpu_capacity({"a100": ClassCapacity(8, 0)})
    assert series(metrics.registry, names.OPERATOR_GPUS_CAPACITY) == [{"gpu_class": "a100"}]
    assert sample(metrics.registry, names.OPERATOR_GPUS_FREE, gpu_class="a100") == 0


def test_predicted_step_keeps_one_series_per_job_the_current_plan_version() -> None:
    metrics = OperatorMetrics()
    predicted = names.JOB_PREDICTED_STEP_SECONDS
    metrics.set_predicted_step("team", "digits", 1, 0.12)
    metrics.set_predicted_step("team", "other", 3, 0.5)
    metrics.set_predicted_step("team", "digits", 2, 0.08)
    assert sorted(s["plan_version"] for s in series(metrics.registry, predicted)) == ["2", "3"]
    digits_v2 = {"namespace": "team", "heterotrain_job": "digits", "plan_version": "2"}
    assert sample(metrics.registry, predicted, **digits_v2) == 0.08
    # A plan without a prediction leaves no made-up value behind.
    metrics.set_predicted_step("team", "digits", 3, None)
    assert [s["heterotrain_job"] for s in series(metrics.registry, predicted)] == ["other"]
    metrics.set_predicted_step("team", "digits", 4, 0.07)
    metrics.forget_job("team", "digits")
    metrics.forget_job("team", "never-seen")
    assert [s["heterotrain_job"] for s in series(metrics.registry, predicted)] == ["other"]
