"""Status bodies as a kubelet writes them (pure): a Ready node, and a pod started, finished, or waiting
with a reason."""

from __future__ import annotations

from typing import Any

RUNNING_CONDITIONS = ("PodScheduled", "Initialized", "ContainersReady", "Ready")


def _container_status(name: str, image: str, state: dict[str, Any], ready: bool) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": "",
        "ready": ready,
        "restartCount": 0,
        "started": ready,
        "state": state,
    }


def running(ip: str, started_at: str, container: str, image: str) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "127.0.0.1",
            "startTime": started_at,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": started_at} for t in RUNNING_CONDITIONS
            ],
            "containerStatuses": [
                _container_status(container, image, {"running": {"startedAt": started_at}}, True)
            ],
        }
    }


def terminated(
    container: str, image: str, code: int, message: str | None, started_at: str, stamp: str
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": code,
        "reason": "Completed" if code == 0 else "Error",
        "finishedAt": stamp,
        "startedAt": started_at or stamp,
    }
    if message:
        state["message"] = message
    return {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "conditions": [
                {"type": t, "status": "False", "lastTransitionTime": stamp}
                for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [_container_status(container, image, {"terminated": state}, False)],
        }
    }


def waiting(container: str, image: str, reason: str, message: str) -> dict[str, Any]:
    """A container that cannot start yet (ErrImageNeverPull, CreateContainerConfigError): the pod
    stays Pending, as under a kubelet."""
    state = {"waiting": {"reason": reason, "message": message}}
    return {"status": {"containerStatuses": [_container_status(container, image, state, False)]}}


def node_ready(name: str, runtime: str, stamp: str) -> dict[str, Any]:
    """A Ready local node; `runtime` says whether its pods run as processes or podman containers."""
    conditions = [
        {
            "type": "Ready",
            "status": "True",
            "reason": "LocalProcessNodeReady",
            "message": "local process node agent is running",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        },
    ] + [
        {
            "type": kind,
            "status": "False",
            "reason": f"No{kind}",
            "message": "",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        for kind in ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")
    ]
    return {
        "status": {
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "local-process",
                "containerRuntimeVersion": "podman+runc" if runtime == "container" else "host-process",
            },
            "phase": "Running",
        }
    }
