"""The Kueue objects an administrator creates for heterotrain: one ResourceFlavor per GPU class, a
ClusterQueue with a GPU quota per flavor, and a LocalQueue in each namespace that submits jobs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator.kueue.constants import API_VERSION
from hetero_operator.resources import GPUClassSpec

Manifest = dict[str, Any]


def resource_flavor(name: str, gpu_class: GPUClassSpec) -> Manifest:
    """A flavor whose node labels are the GPUClass's node selector: a pod set pinned to the class by
    that selector fits this flavor and no other class's."""
    spec: Manifest = {"nodeLabels": dict(gpu_class.node_selector)}
    if gpu_class.tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in gpu_class.tolerations]
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name}, "spec": spec}


def cluster_queue(
    name: str, resource: str, quotas: Mapping[str, int], preempt_lower_priority: bool = False
) -> Manifest:
    """A ClusterQueue covering `resource` with `quotas` ({flavor: nominal quota}, tried in that
    order), open to every namespace; `preempt_lower_priority`: a workload that does not fit may
    evict lower-priority workloads of the same queue."""
    if not quotas:
        raise ValueError(f"ClusterQueue {name!r} needs a quota for at least one flavor")
    flavors = [
        {"name": flavor, "resources": [{"name": resource, "nominalQuota": str(quota)}]}
        for flavor, quota in quotas.items()
    ]
    spec: Manifest = {
        "namespaceSelector": {},
        "resourceGroups": [{"coveredResources": [resource], "flavors": flavors}],
    }
    if preempt_lower_priority:
        spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name}, "spec": spec}


def local_queue(name: str, namespace: str, cluster_queue_name: str) -> Manifest:
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }
