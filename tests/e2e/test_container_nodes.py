"""Pods as containers on the test bed: the local node agent runs a pod's container from its image with
podman and runc, under the pod's security context, with its ConfigMap, emptyDir and claim volumes; a
HeteroTrainJob runs end to end through the operator on such nodes, so the pod spec the operator
writes is proven in a container; and a job whose image is on no node meets its start timeout."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml
from tests.beds import bed_of
from tests.operator.live import Jobs, OperatorProcess, jobs_in, wait_for
from tests.ship.kernel_view import kernel_view

from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.container_store import Engine
from hetero_operator.testbed.containers import container_name
from hetero_operator.testbed.nodes import FakeNode, NodeList
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
    with bed_of(tmp_path_factory.mktemp("container-bed"), NODES) as bed:
        yield bed


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


class Recorder:
    """Every object a watch of one namespace delivers, in order, as (event type, object): a state a
    job passes through for a second is seen even when the test polls slowly."""

    def __init__(self, list_call: Callable[..., Any], *args: str) -> None:
        self.list_call, self.args = list_call, args
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.watch = kubernetes.watch.Watch()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.closing = False
        self.broken = ""

    def _run(self) -> None:
        sanitize = kubernetes.client.ApiClient().sanitize_for_serialization
        try:
            for event in self.watch.stream(self.list_call, *self.args, timeout_seconds=300):
                self.events.append((event["type"], sanitize(event["object"])))
        except Exception as error:  # reported by the test: a watch that broke saw too little
            if not self.closing:
                self.broken = f"the watch broke: {error}"

    def __enter__(self) -> Recorder:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.closing = True
        self.watch.stop()


def stamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def named_condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


START_TIMEOUT = 15
ABSENT_IMAGE = "localhost/heterotrain/absent:0"
# "worker pod NAME not Running after N s: REASON (MESSAGE)", as the install guide documents it.
NOT_RUNNING = re.compile(r"^worker pod (\S+) not Running after (\d+) s: (\w+) \((.*?)\); ")


def test_a_job_whose_image_is_on_no_node_fails_at_its_start_timeout(
    testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    """No node has the image and none may pull it (the container node pulls from no registry), so
    each worker waits in ErrImageNeverPull, as under a kubelet that may not pull. Each start ends
    at the timeout with its pods deleted and its GPUs released; the second, with no restart left,
    fails the job."""
    jobs = Jobs(testbed, namespace)
    manifest = jobs.manifest(
        "stuck",
        gpus=2,
        image=ABSENT_IMAGE,
        gpuClasses=["fast", "slow"],
        startTimeoutSeconds=START_TIMEOUT,
        restartPolicy={"maxRestarts": 1, "backoffSeconds": 2},
    )
    api = kubernetes.config.new_client_from_config(str(testbed.kubeconfig))
    custom, core = kubernetes.client.CustomObjectsApi(api), kubernetes.client.CoreV1Api(api)
    operator = OperatorProcess(testbed, tmp_path / "operator.log")
    operator.start()
    try:
        with (
            jobs_in(testbed, namespace, timeout=60, until_gone=True),
            Recorder(
                custom.list_namespaced_custom_object,
                "heterotrain.io",
                "v1alpha1",
                namespace,
                "heterotrainjobs",
            ) as job_watch,
            Recorder(core.list_namespaced_pod, namespace) as pod_watch,
        ):
            jobs.apply(manifest)
            final = jobs.wait_phase("stuck", "Failed", timeout=3 * START_TIMEOUT + 60)
            wait_for(lambda: not jobs.pods("stuck") or None, 60, "the workers to be deleted")
            # The GPUs are free again: a job that needs both nodes' only GPU is placed on them.
            jobs.apply({**manifest, "metadata": {**manifest["metadata"], "name": "next"}})
            nodes = wait_for(
                lambda: (
                    len(placed := jobs.pods("next")) == 2 and sorted(p["spec"]["nodeName"] for p in placed)
                ),
                60,
                "the next job's two workers",
            )
        assert not job_watch.broken and not pod_watch.broken, job_watch.broken or pod_watch.broken
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(40)}")
    assert nodes == ["ctr-fast", "ctr-slow"]

    # What each worker pod went through, from the API server: why it waited, when it was created,
    # and whether it was deleted.
    waited: dict[str, tuple[str, str]] = {}
    created: dict[str, float] = {}
    deleted: set[str] = set()
    for kind, pod_seen in pod_watch.events:
        name = pod_seen["metadata"]["name"]
        if not name.startswith("stuck-"):
            continue
        created[name] = stamp(pod_seen["metadata"]["creationTimestamp"])
        if kind == "DELETED":
            deleted.add(name)
        for container in pod_seen.get("status", {}).get("containerStatuses") or []:
            waiting = container.get("state", {}).get("waiting")
            if waiting:
                waited[name] = (waiting["reason"], waiting.get("message", ""))
    assert sorted(created) == ["stuck-g0-w0", "stuck-g0-w1", "stuck-g1-w0", "stuck-g1-w1"]
    assert deleted == set(created), "every worker of both starts was deleted"
    assert {reason for reason, _ in waited.values()} == {"ErrImageNeverPull"}
    assert all(ABSENT_IMAGE in message for _, message in waited.values())

    # The first start timed out: queued again with its GPUs released, Placed naming a pod and why
    # it waited.
    statuses = [s for _, job in job_watch.events if (s := job.get("status") or {})]
    requeued = next(s for s in statuses if named_condition(s, "Placed").get("reason") == "StartTimeout")
    assert (requeued["phase"], requeued["restarts"]) == ("Queued", 1)
    assert requeued["allocation"]["workers"] == []
    match = NOT_RUNNING.match(named_condition(requeued, "Placed")["message"])
    assert match is not None, named_condition(requeued, "Placed")
    pod_name, seconds, reason, message = match.groups()
    assert pod_name in ("stuck-g0-w0", "stuck-g0-w1") and int(seconds) >= START_TIMEOUT
    assert (reason, message) == waited[pod_name]

    # The second start timed out too: with no restart left the job failed, no sooner than the
    # timeout after that start's pods were created.
    assert (final["phase"], final["restarts"]) == ("Failed", 1)
    assert final["allocation"]["workers"] == []
    failed = named_condition(final, "Failed")
    assert failed["reason"] == "StartTimeout"
    match = NOT_RUNNING.match(failed["message"])
    assert match is not None, failed
    pod_name, seconds, reason, message = match.groups()
    assert pod_name in ("stuck-g1-w0", "stuck-g1-w1") and int(seconds) >= START_TIMEOUT
    assert (reason, message) == waited[pod_name]
    assert "no restarts left" in failed["message"]
    second_start = min(created["stuck-g1-w0"], created["stuck-g1-w1"])
    assert stamp(failed["lastTransitionTime"]) >= second_start + START_TIMEOUT
