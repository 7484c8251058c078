"""Shared test beds stay clean: what a test adds of the cluster-scoped objects a job depends on (GPU
classes, queues, nodes) must be gone when its teardown ends, or the next test on the bed inherits it
(a queue left behind makes every later job without `spec.queue` wait). The check fails the test that
left it, so order dependence shows as a failure of the test that causes it.

The throughput catalog (WorkloadProfiles) is the operator's memory of what jobs measured, not something
a test adds: it is forgotten after every test, so that no test's first split depends on what an
earlier test's jobs measured."""

from __future__ import annotations

from functools import cache
from typing import Any

from kubernetes import client, config

from hetero_operator.testbed.cluster import Testbed

CUSTOM_KINDS = (("heterotrain.io", "v1alpha1", "gpuclasses"), ("heterotrain.io", "v1alpha1", "heteroqueues"))


@cache
def _api(kubeconfig: str) -> client.ApiClient:
    return config.new_client_from_config(config_file=kubeconfig)


def cluster_objects(bed: Testbed) -> set[str]:
    """The bed's GPU classes, queues and nodes, as kind/name (three list calls, no kubectl)."""
    api = _api(str(bed.kubeconfig))
    found = {
        f"nodes/{node.metadata.name}" for node in client.CoreV1Api(api).list_node(timeout_seconds=10).items
    }
    custom: Any = client.CustomObjectsApi(api)
    for group, version, plural in CUSTOM_KINDS:
        listed = custom.list_cluster_custom_object(group, version, plural, timeout_seconds=10)
        found |= {f"{plural}/{item['metadata']['name']}" for item in listed["items"]}
    return found


def forget_catalog(bed: Testbed) -> None:
    """Delete every WorkloadProfile on the bed (one collection delete)."""
    custom: Any = client.CustomObjectsApi(_api(str(bed.kubeconfig)))
    custom.delete_collection_cluster_custom_object("heterotrain.io", "v1alpha1", "workloadprofiles")


def beds_of(funcargs: dict[str, Any]) -> list[Testbed]:
    """The running test beds among a test's fixtures."""
    seen: dict[int, Testbed] = {}
    for value in funcargs.values():
        if isinstance(value, Testbed):
            seen[id(value)] = value
    return list(seen.values())
