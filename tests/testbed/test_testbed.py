"""The test bed itself: real nodes with GPUs, pods that run, Prometheus that answers and discovers."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from hetero_operator.testbed.cluster import LOCAL_SPEED_SCALE, Testbed
from hetero_operator.testbed.nodes import GPU_RESOURCE, FakeNode, NodeList, load_node_list

pytestmark = pytest.mark.testbed
EXAMPLE_NODES = Path(__file__).resolve().parents[2] / "examples" / "nodes.yaml"


def _eventually(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.3) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")


def _get(testbed: Testbed, *args: str) -> dict[str, Any]:
    return json.loads(testbed.kubectl("get", *args, "-o", "json").stdout)


def test_api_server_reports_the_pinned_version(testbed: Testbed) -> None:
    version = json.loads(testbed.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"


def test_fake_nodes_are_ready_with_gpu_capacity(testbed: Testbed) -> None:
    example = {n.name for n in load_node_list(EXAMPLE_NODES).nodes}
    nodes = [
        n for n in _get(testbed, "nodes", "-l", "type=kwok")["items"] if n["metadata"]["name"] in example
    ]
    assert len(nodes) == len(example) == 6
    for node in nodes:
        assert node["status"]["capacity"][GPU_RESOURCE] == "4"
        assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True"
    products = {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes}
    assert len(products) == 3


def _fake_pod(name: str, node: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "nodeName": node,
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "none", "resources": {"limits": {GPU_RESOURCE: "1"}}}],
        },
    }


@pytest.mark.parametrize(("code", "phase"), [("0", "Succeeded"), ("7", "Failed")])
def test_fake_pods_run_and_finish_by_annotation(
    testbed: Testbed, namespace: str, code: str, phase: str
) -> None:
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_fake_pod("p", "gpu-fast-0")))
    pod = _eventually(
        lambda: (p := _get(testbed, "pod", "p", "-n", namespace))["status"].get("phase") == "Running" and p
    )
    assert pod["status"]["podIP"].startswith("127.200.")
    testbed.kubectl("annotate", "pod", "p", "-n", namespace, f"heterotrain.io/testbed-exit-code={code}")
    done = _eventually(
        lambda: (p := _get(testbed, "pod", "p", "-n", namespace))["status"]["phase"] == phase and p
    )
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == int(code)


def test_fake_pod_starts_after_the_delay_it_is_annotated_with(testbed: Testbed, namespace: str) -> None:
    delayed = _fake_pod("slow-start", "gpu-fast-0", {"testbed.heterotrain.io/start-delay": "4s"})
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(delayed))
    time.sleep(1.5)
    assert _get(testbed, "pod", "slow-start", "-n", namespace)["status"].get("phase") == "Pending"
    pod = _eventually(
        lambda: (
            (p := _get(testbed, "pod", "slow-start", "-n", namespace))["status"].get("phase") == "Running"
            and p
        )
    )
    created = datetime.fromisoformat(pod["metadata"]["creationTimestamp"])
    started = datetime.fromisoformat(pod["status"]["startTime"])
    # Both are truncated to the second, so 4 s of delay shows as at least 3.
    assert (started - created).total_seconds() >= 3


def test_prometheus_answers_a_query(testbed: Testbed) -> None:
    def query() -> list[Any]:
        body = httpx.get(
            f"{testbed.prometheus_url}/api/v1/query", params={"query": 'up{job="prometheus"}'}
        ).json()
        assert body["status"] == "success"
        return list(body["data"]["result"])

    result = _eventually(query)
    assert result[0]["value"][1] == "1"


def test_prometheus_discovers_annotated_pods_through_the_api_server(testbed: Testbed, namespace: str) -> None:
    annotations = {"prometheus.io/scrape": "true", "prometheus.io/port": "9999"}
    testbed.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=yaml.safe_dump(_fake_pod("scraped", "gpu-slow-0", annotations)),
    )

    def discovered() -> list[dict[str, Any]]:
        targets = httpx.get(f"{testbed.prometheus_url}/api/v1/targets").json()["data"]["activeTargets"]
        return [t for t in targets if t["labels"].get("namespace") == namespace]

    target = _eventually(discovered, timeout=60)[0]
    assert target["labels"]["pod"] == "scraped"
    assert target["scrapeUrl"].startswith("http://127.200.") and ":9999/" in target["scrapeUrl"]


def test_local_process_node_runs_pods_as_processes(testbed: Testbed, namespace: str) -> None:
    testbed.apply_nodes(
        NodeList(
            nodes=[
                FakeNode(
                    name="local-test",
                    gpu_class="slow",
                    gpus=1,
                    local=True,
                    labels={"nvidia.com/gpu.product": "Tesla-T4"},
                )
            ]
        )
    )
    # The example classes, unless the shared bed has them already: what this test adds, it deletes.
    existing = set(testbed.kubectl("get", "gpuclasses", "-o", "name").stdout.split())
    applied = set(testbed.kubectl("apply", "-f", "examples/gpuclasses.yaml", "-o", "name").stdout.split())
    script = (
        "import os, sys; print(os.environ['POD_IP'], os.environ['MASTER_ADDR'], "
        "os.environ['HETEROTRAIN_SIMULATED_SPEED'], open(os.environ['PLAN']).read()); sys.exit(3)"
    )
    objects = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plan"}, "data": {"plan.json": "v7"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "grp"}, "spec": {"clusterIP": "None"}},
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "w0"},
            "spec": {
                "nodeName": "local-test",
                "hostname": "w0",
                "subdomain": "grp",
                "restartPolicy": "Never",
                "volumes": [{"name": "plan", "configMap": {"name": "plan"}}],
                "containers": [
                    {
                        "name": "main",
                        "image": "ignored",
                        "command": ["python", "-c", script],
                        "env": [
                            {"name": "MASTER_ADDR", "value": f"w0.grp.{namespace}.svc"},
                            {"name": "PLAN", "value": "/etc/plan/plan.json"},
                        ],
                        "volumeMounts": [{"name": "plan", "mountPath": "/etc/plan"}],
                    }
                ],
            },
        },
    ]
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(objects))
    pod = _eventually(
        lambda: (p := _get(testbed, "pod", "w0", "-n", namespace))["status"].get("phase") == "Failed" and p
    )
    ip = pod["status"]["podIP"]
    assert ip.startswith("127.10.")
    assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    logs = list((testbed.root / "local-pods" / "pods" / namespace).glob("w0-*/container.log"))
    assert logs, "the pod's output is kept"
    # Own address, DNS name resolved to it, slow class speed (0.25 of the fastest, dilated), plan file.
    assert logs[0].read_text().split() == [ip, ip, f"{0.25 * LOCAL_SPEED_SCALE:g}", "v7"]
    testbed.kubectl("delete", "node", "local-test")
    for added in sorted(applied - existing):
        testbed.kubectl("delete", added)


def test_up_is_idempotent(testbed: Testbed) -> None:
    pids = {name: info["pid"] for name, info in testbed.state.processes.items()}  # type: ignore[union-attr]
    testbed.up()
    assert {name: info["pid"] for name, info in testbed.state.processes.items()} == pids  # type: ignore[union-attr]
