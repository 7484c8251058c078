"""Pods as containers on the test bed: the local node agent runs a pod's container from its image with
podman and runc, under the pod's security context, with its ConfigMap, emptyDir and claim volumes; and
a HeteroTrainJob runs end to end through the operator on such nodes, so the pod spec the operator
writes is proven in a container."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.operator.live import Jobs, OperatorProcess, wait_for
from tests.ship.kernel_view import kernel_view

from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine
from hetero_operator.testbed.containers import container_name
from hetero_operator.testbed.nodes import FakeNode, NodeList
from hetero_operator.testbed.versions import REPO_ROOT
from hetero_runtime.checkpoint import latest_checkpoint, load

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(600)]
NODES = NodeList(
    nodes=[
        FakeNode(
            name=f"ctr-{speed}",
            gpu_class=speed,
            gpus=1,
            local=True,
            runtime="container",
            labels={"nvidia.com/gpu.product": product},
        )
        for speed, product in (("fast", "NVIDIA-A100-SXM4-80GB"), ("slow", "Tesla-T4"))
    ]
)
# Run inside the container by the base image's Python: what the process can see and do.
PROBE = """
import json, os
report = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
          "caps": open("/proc/self/status").read().split("CapEff:")[1].split()[0],
          "greeting": open("/etc/cfg/greeting").read(), "pod_ip": os.environ["POD_IP"]}
try:
    open("/probe", "w")
    report["root"] = "writable"
except OSError as err:
    report["root"] = err.strerror
for path in ("/scratch/a", "/data/b"):
    with open(path, "w") as out:
        out.write("x")
print(json.dumps(report))
raise SystemExit(3)
"""


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """This module's own test bed (in place of the shared one): its only nodes run pods as containers."""
    bed = Testbed(tmp_path_factory.mktemp("container-bed"))
    try:
        bed.up(NODES)
        bed.kubectl("apply", "-f", str(REPO_ROOT / "examples" / "gpuclasses.yaml"))
        yield bed
    finally:
        bed.down()


def pod(name: str, image: str, command: list[str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": "ctr-slow",
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": image, "command": command}],
            **spec,
        },
    }


def get(bed: Testbed, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result = bed.kubectl("get", kind, name, "-n", namespace, "-o", "json", check=False)
    return dict(json.loads(result.stdout)) if result.returncode == 0 else {}


def apply(bed: Testbed, namespace: str, *objects: dict[str, Any]) -> None:
    bed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(list(objects)))


def waiting_reason(bed: Testbed, namespace: str, name: str) -> tuple[str, str] | None:
    status = get(bed, namespace, "pod", name).get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = container.get("state", {}).get("waiting")
        if waiting and status.get("phase") == "Pending":
            return waiting["reason"], waiting["message"]
    return None


def test_a_container_pod_runs_under_its_security_context_with_its_volumes(
    testbed: Testbed, namespace: str, built_images: dict[str, str]
) -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg"},
        "data": {"greeting": "hi"},
    }
    probe = pod(
        "probe",
        built_images["base"],
        ["python3", "-c", PROBE],
        securityContext={"runAsUser": 1234, "runAsGroup": 1234, "fsGroup": 2345, "runAsNonRoot": True},
        volumes=[
            {"name": "cfg", "configMap": {"name": "cfg"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "data", "persistentVolumeClaim": {"claimName": "shared"}},
        ],
    )
    probe["spec"]["containers"][0].update(
        securityContext={
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        volumeMounts=[
            {"name": "cfg", "mountPath": "/etc/cfg"},
            {"name": "scratch", "mountPath": "/scratch"},
            {"name": "data", "mountPath": "/data"},
        ],
    )
    apply(testbed, namespace, config_map, probe)
    done = wait_for(
        lambda: (
            (p := get(testbed, namespace, "pod", "probe")).get("status", {}).get("phase") == "Failed" and p
        ),
        120,
        "the probe pod to exit",
    )
    assert done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
    pod_dir = next((testbed.root / "local-pods" / "pods" / namespace).glob("probe-*"))
    report = json.loads((pod_dir / "container.log").read_text().splitlines()[-1])
    assert report["uid"] == 1234 and report["gid"] == 1234 and 2345 in report["groups"]
    assert report["caps"] == "0000000000000000"
    assert report["root"] == "Read-only file system"
    assert report["greeting"] == "hi"
    assert report["pod_ip"] == done["status"]["podIP"] and report["pod_ip"].startswith("127.10.")
    claimed = testbed.root / "local-pods" / "claims" / namespace / "shared" / "b"
    assert (claimed.stat().st_uid, claimed.stat().st_gid) == (1234, 2345), "fsGroup owns the claim"
    assert (pod_dir / "volumes" / "scratch" / "a").read_text() == "x"


def test_a_pod_that_cannot_start_waits_with_the_kubelets_reason(
    testbed: Testbed, namespace: str, built_images: dict[str, str]
) -> None:
    absent = pod("absent", "localhost/heterotrain/absent:0", ["true"])
    as_root = pod("as-root", built_images["base"], ["true"], securityContext={"runAsNonRoot": True})
    apply(testbed, namespace, absent, as_root)
    reason, message = wait_for(lambda: waiting_reason(testbed, namespace, "absent"), 60, "absent to wait")
    assert reason == "ErrImageNeverPull" and "localhost/heterotrain/absent:0" in message
    reason, message = wait_for(lambda: waiting_reason(testbed, namespace, "as-root"), 60, "as-root to wait")
    assert reason == "CreateContainerConfigError" and "image will run as root" in message


def test_deleting_a_container_pod_stops_and_removes_its_container(
    testbed: Testbed, namespace: str, built_images: dict[str, str], container_engine: Engine
) -> None:
    apply(
        testbed,
        namespace,
        pod("sleeper", built_images["base"], ["python3", "-c", "import time; time.sleep(600)"]),
    )
    running = wait_for(
        lambda: (
            (p := get(testbed, namespace, "pod", "sleeper")).get("status", {}).get("phase") == "Running" and p
        ),
        60,
        "the sleeper to run",
    )
    name = container_name(running["metadata"]["uid"])
    assert container_engine.run("podman", "container", "exists", name, check=False).returncode == 0
    testbed.kubectl("delete", "pod", "sleeper", "-n", namespace, "--grace-period=2", "--wait=false")
    wait_for(lambda: not get(testbed, namespace, "pod", "sleeper") or None, 60, "the sleeper pod to go")
    assert container_engine.run("podman", "container", "exists", name, check=False).returncode == 1


def test_a_job_runs_through_the_operator_in_containers(
    testbed: Testbed, namespace: str, built_images: dict[str, str], container_engine: Engine, tmp_path: Path
) -> None:
    jobs = Jobs(testbed, namespace)
    manifest = jobs.manifest(
        "digits",
        gpus=2,
        image=built_images["trainer"],
        command=["heterotrain", "worker", "digits"],
        gpuClasses=["fast", "slow"],
        batch={"global": 256},
        epochs=3,
        env=[{"name": "DIGITS_PASSES_PER_EPOCH", "value": "4"}],
        checkpoint={"path": "/checkpoints", "everyEpochs": 1},
    )
    operator = OperatorProcess(testbed, tmp_path / "operator.log")
    operator.start()
    try:
        jobs.apply(manifest)
        pods = wait_for(
            lambda: len(jobs.running_pods("digits")) == 2 and jobs.running_pods("digits"), 180, "2 workers"
        )
        views = {
            p["metadata"]["name"]: wait_for(
                lambda p=p: kernel_view(container_engine, container_name(p["metadata"]["uid"])),
                60,
                "a worker",
            )
            for p in pods
        }
        status = jobs.wait_phase("digits", "Succeeded", timeout=300)
    finally:
        operator.stop()
    for worker in pods:
        view, spec = views[worker["metadata"]["name"]], worker["spec"]
        # What the kernel saw of each worker's process is what the operator's pod spec asked for.
        assert view["uid"] == str(spec["securityContext"]["runAsUser"])
        assert spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        assert view["root_options"].split(",")[0] == "ro"
        assert spec["containers"][0]["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert view["caps"] == "0000000000000000"
    assert status["phase"] == "Succeeded"
    (claim,) = (testbed.root / "local-pods" / "claims" / namespace).iterdir()
    checkpoint = latest_checkpoint(claim)
    assert checkpoint is not None, "rank 0 wrote its checkpoints to the claim"
    assert load(checkpoint)["epochs_done"] == 3, "every epoch ran, in the containers"
    fs_group = pods[0]["spec"]["securityContext"]["fsGroup"]
    assert all(p.stat().st_gid == fs_group for p in claim.rglob("*")), "the claim belongs to fsGroup"
