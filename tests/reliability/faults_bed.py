"""A test bed of the fault tests' own: its nodes, its GPU classes, and crashing its components.

Destructive faults (a control plane restart, a node taken away, Prometheus stopped) happen here and
never on the session's shared test bed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from hetero_operator.testbed import processes
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import KWOK_TAINT_KEY, FakeNode, NodeList

REPO = Path(__file__).resolve().parents[2]
FAKE_CLASS = "kwok"
FAKE_PRODUCT = "KWOK-Fake-GPU"
FAKE_NODES = 10
GPUS_PER_FAKE_NODE = 4


def fault_nodes(local: bool) -> NodeList:
    """Fake KWOK nodes of one class of their own, plus (when `local`) the demo's three process nodes.

    The fake nodes carry a GPU product no example class selects, so jobs of the example classes land
    on the process nodes only, and jobs of the fake class on the fake nodes only.
    """
    fake = [
        FakeNode(
            name=f"kwok-{index}",
            gpuClass=FAKE_CLASS,
            gpus=GPUS_PER_FAKE_NODE,
            labels={"nvidia.com/gpu.product": FAKE_PRODUCT},
        )
        for index in range(FAKE_NODES)
    ]
    demo = NodeList.model_validate(yaml.safe_load((REPO / "tests" / "e2e" / "nodes.yaml").read_text()))
    return NodeList(nodes=[*fake, *(demo.nodes if local else [])])


def fake_node(name: str) -> NodeList:
    return NodeList(
        nodes=[
            FakeNode(
                name=name,
                gpuClass=FAKE_CLASS,
                gpus=GPUS_PER_FAKE_NODE,
                labels={"nvidia.com/gpu.product": FAKE_PRODUCT},
            )
        ]
    )


def gpu_classes() -> list[dict[str, Any]]:
    """The example classes (they select the process nodes) and one for the fake nodes."""
    examples = [doc for doc in yaml.safe_load_all((REPO / "examples" / "gpuclasses.yaml").read_text()) if doc]
    fake = {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "GPUClass",
        "metadata": {"name": FAKE_CLASS},
        "spec": {
            "nodeSelector": {"nvidia.com/gpu.product": FAKE_PRODUCT},
            "resourceName": "nvidia.com/gpu",
            "memoryGiB": 16,
            "relativeSpeed": 1.0,
            "costWeight": 1.0,
            "tolerations": [{"key": KWOK_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    return [*examples, fake]


START_DELAY_ANNOTATION = "testbed.heterotrain.io/start-delay"  # see the test bed's KWOK stages


def kwok_job(
    name: str, namespace: str, gpus: int, max_restarts: int = 2, start_delay: str | None = None
) -> dict[str, Any]:
    """A HeteroTrainJob for the fake nodes; its pods end when annotated with an exit code, and start
    `start_delay` (a Go duration) after they are bound, as a kubelet's pull and start would make them."""
    body: dict[str, Any] = {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "image": "heterotrain/trainer:test",
            "command": ["heterotrain", "worker"],
            "gpus": {"min": gpus, "max": gpus},
            "gpuClasses": [FAKE_CLASS],
            "batch": {"global": 64},
            "epochs": 1,
            "restartPolicy": {"maxRestarts": max_restarts, "backoffSeconds": 0},
        },
    }
    if start_delay is not None:
        body["spec"]["template"] = {"metadata": {"annotations": {START_DELAY_ANNOTATION: start_delay}}}
    return body


def start_bed(root: Path, local: bool) -> Testbed:
    bed = Testbed(root)
    bed.up(fault_nodes(local))
    bed.apply_objects(gpu_classes())
    return bed


# --- crashing components -------------------------------------------------------------------------


def _argv(pid: int) -> list[str]:
    return [part.decode() for part in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]


def crash(bed: Testbed, name: str) -> list[str]:
    """SIGKILL one component (no graceful shutdown, as in a machine crash); returns its command line
    so that `start_again` brings it back exactly as it was (same ports, same data directory)."""
    state = bed.state
    assert state is not None, "the fault test bed is not up"
    info = state.processes[name]
    argv = _argv(info["pid"])
    with contextlib.suppress(ProcessLookupError):
        os.killpg(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while processes.is_running(info["pid"], info["binary"]):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info["pid"], os.WNOHANG)
        assert time.monotonic() < deadline, f"{name} outlived SIGKILL"
        time.sleep(0.05)
    return argv


def start_again(bed: Testbed, name: str, argv: list[str], timeout: float = 60) -> float:
    """Relaunch a crashed component and wait until it serves; returns the seconds that took."""
    started = time.monotonic()
    state = bed.state
    assert state is not None
    launched = processes.launch(name, argv, bed.logs)
    state.processes[name] = {"pid": launched.pid, "binary": launched.binary, "log": str(launched.log)}
    state.save(bed.state_file)
    ready = {"etcd": lambda: _etcd_healthy(bed), "kube-apiserver": lambda: _apiserver_ready(bed)}[name]
    while not ready():
        assert time.monotonic() - started < timeout, f"{name} did not come back within {timeout:.0f} s"
        assert processes.is_running(launched.pid, launched.binary), f"{name} exited; see {launched.log}"
        time.sleep(0.2)
    return time.monotonic() - started


def _etcd_healthy(bed: Testbed) -> bool:
    state = bed.state
    assert state is not None
    try:
        url = f"http://127.0.0.1:{state.ports['etcd_client']}/health"
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _apiserver_ready(bed: Testbed) -> bool:
    try:
        result = bed.kubectl("get", "--raw", "/readyz", "--request-timeout=2s", check=False, timeout=5)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0
