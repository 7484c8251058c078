"""What kopf's indexes would hold for the in-process Kubernetes (tests/fakekube.py): the operator's
index records built from the stored objects, as its index functions build them."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hetero_operator.controller.catalog import estimates, valid_profiles
from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, PodFacts, QueueFacts
from hetero_operator.controller.inventory import pod_index_key
from hetero_operator.kueue.facts import ClusterQueueFacts, FlavorFacts, LocalQueueFacts, WorkloadFacts
from hetero_operator.resources import GPUClass, HeteroQueue, InvalidResourceError

Key = tuple[str, str, str]  # (plural, namespace or "", name)


class Indexes(Mapping[str, Mapping[str, list[object]]]):
    """The operator's indexes (`htj_classes`, `htj_nodes`, `htj_jobs`, `htj_pods`, `htj_queues`,
    `htj_profiles` and Kueue's)."""

    def __init__(self, objects: Callable[[], Mapping[Key, Mapping[str, Any]]]) -> None:
        self._objects = objects

    def __getitem__(self, name: str) -> Mapping[str, list[object]]:
        return _build(self._objects())[name]

    def __iter__(self) -> Iterator[str]:
        return iter(INDEX_NAMES)

    def __len__(self) -> int:
        return len(INDEX_NAMES)


INDEX_NAMES = (
    "htj_classes",
    "htj_nodes",
    "htj_jobs",
    "htj_pods",
    "htj_queues",
    "htj_profiles",
    "htj_workloads",
    "htj_local_queues",
    "htj_cluster_queues",
    "htj_flavors",
)


def _build(objects: Mapping[Key, Mapping[str, Any]]) -> dict[str, dict[str, list[object]]]:
    built: dict[str, dict[str, list[object]]] = {name: {} for name in INDEX_NAMES}
    for (plural, namespace, name), body in objects.items():
        if _build_kueue(built, plural, namespace, name, body):
            continue
        if plural == "gpuclasses":
            try:
                built["htj_classes"][name] = [ClassFacts.from_model(GPUClass.from_k8s(dict(body)))]
            except InvalidResourceError:
                continue
        elif plural == "heteroqueues":
            try:
                built["htj_queues"][name] = [QueueFacts.from_model(HeteroQueue.from_k8s(dict(body)))]
            except InvalidResourceError:
                continue
        elif plural == "workloadprofiles":
            for key, estimate in estimates(valid_profiles([body])).items():
                built["htj_profiles"][key] = [estimate]
        elif plural == "nodes":
            built["htj_nodes"][name] = [NodeFacts.from_body(body)]
        elif plural == "heterotrainjobs":
            facts = JobFacts.from_body(body)
            built["htj_jobs"][facts.key] = [facts]
        elif plural == "pods":
            pod = PodFacts.from_body(body)
            if pod.job is not None or (pod.resources and pod.node):
                built["htj_pods"].setdefault(pod_index_key(pod), []).append(pod)
    return built


def _build_kueue(
    built: dict[str, dict[str, list[object]]], plural: str, namespace: str, name: str, body: Mapping[str, Any]
) -> bool:
    """The Kueue indexes (True: `body` was a Kueue object)."""
    if plural == "workloads":
        workload = WorkloadFacts.from_body(body)
        if workload is not None:
            built["htj_workloads"].setdefault(workload.job_key, []).append(workload)
    elif plural == "localqueues":
        built["htj_local_queues"][f"{namespace}/{name}"] = [LocalQueueFacts.from_body(body)]
    elif plural == "clusterqueues":
        built["htj_cluster_queues"][name] = [ClusterQueueFacts.from_body(body)]
    elif plural == "resourceflavors":
        built["htj_flavors"][name] = [FlavorFacts.from_body(body)]
    else:
        return False
    return True
