"""Fake GPU nodes for the test bed: the node-list file format and the Node manifests built from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GPU_RESOURCE = "nvidia.com/gpu"
GPU_CLASS_LABEL = "heterotrain.io/gpu-class"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
# The taint KWOK's documentation puts on fake nodes; the test bed's nodes do not carry it (see
# node_manifest), but classes may still tolerate it for clusters that do.
KWOK_TAINT_KEY = "kwok.x-k8s.io/node"
LOCAL_NODE_LABEL = "heterotrain.io/local-process-node"
# How a local node runs its pods: as host processes (the image ignored) or as containers of their images.
LOCAL_RUNTIME_LABEL = "heterotrain.io/local-node-runtime"
PROCESS_RUNTIME = "process"
# A local process node's true simulated speed (in (0, 1]: a share of the fastest GPU's), whatever its
# GPUClass's relativeSpeed prior says: the test bed's truth, which measurement must find. Written
# from a node list's `speed`; without it the prior is the truth.
TRUE_SPEED_ANNOTATION = "testbed.heterotrain.io/speed"
CONTAINER_RUNTIME = "container"


class FakeNode(BaseModel):
    """One simulated GPU node."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    gpu_class: str = Field(alias="gpuClass", min_length=1)
    gpus: int = Field(ge=0, le=64)
    labels: dict[str, str] = Field(default_factory=dict)
    local: bool = Field(
        default=False,
        description="Run this node's pods on this machine instead of simulating them.",
    )
    speed: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="For a local node: its true simulated speed, a share of the fastest GPU's, set "
        "independently of its GPUClass's relativeSpeed prior (unset: the prior is the truth).",
    )
    runtime: Literal["process", "container"] = Field(
        default="process",
        description="For a local node: run its pods as host processes, or as containers of their images "
        "(podman with runc, under the pod's security context).",
    )

    @model_validator(mode="after")
    def _container_needs_local(self) -> FakeNode:
        if self.runtime == CONTAINER_RUNTIME and not self.local:
            raise ValueError(f"node {self.name}: runtime container needs local: true (KWOK simulates pods)")
        if self.speed is not None and not self.local:
            raise ValueError(f"node {self.name}: speed needs local: true (KWOK nodes run no workers)")
        return self


class NodeList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    nodes: list[FakeNode] = Field(min_length=1)

    @field_validator("nodes")
    @classmethod
    def _unique_names(cls, nodes: list[FakeNode]) -> list[FakeNode]:
        names = [n.name for n in nodes]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node names must be unique; repeated: {', '.join(duplicates)}")
        return nodes


def load_node_list(path: Path) -> NodeList:
    """Read a node-list YAML file (`nodes: [{name, gpuClass, gpus, labels}]`)."""
    return NodeList.model_validate(yaml.safe_load(path.read_text()))


def node_manifest(node: FakeNode) -> dict[str, Any]:
    """The Node object for one fake node. KWOK manages it unless it is a local process node."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", GPU_RESOURCE: str(node.gpus)}
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        GPU_CLASS_LABEL: node.gpu_class,
        **node.labels,
    }
    metadata: dict[str, Any] = {"name": node.name, "labels": labels, "annotations": {}}
    # No KWOK taint (kwok.x-k8s.io/node=fake:NoSchedule): it keeps a kube-scheduler's pods off fake
    # nodes, and the test bed runs no kube-scheduler. Without it the GPUClasses written for a real
    # cluster (examples/gpuclasses.yaml) place jobs here unchanged.
    spec: dict[str, Any] = {}
    if node.local:
        labels[LOCAL_NODE_LABEL] = "true"
        labels[LOCAL_RUNTIME_LABEL] = node.runtime
        if node.speed is not None:
            metadata["annotations"][TRUE_SPEED_ANNOTATION] = f"{node.speed:g}"
    else:
        metadata["annotations"][KWOK_ANNOTATION] = "fake"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": metadata,
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }
