"""The operator, running with nothing but the chart's ServiceAccount, takes a job from creation to
Succeeded and through deletion: proof that the chart's RBAC is enough.

The operator authenticates with a token the TokenRequest API issued for the ServiceAccount, so every
request it makes is authorised exactly as it would be in its pod. (A kubeconfig `as:` field would not
do: kopf's own client ignores impersonation settings.) The chart watches only the test's namespace, so
the RBAC under test is the namespaced layout: a Role there plus the small ClusterRole.
"""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cluster_helpers import get_json, service_account_kubeconfig, wait_until
from helm_chart import REPO_ROOT, helm, install_chart

from hetero_operator.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed

RELEASE = "ht"
ACCOUNT = f"{RELEASE}-heterotrain"
TOLERATE_KWOK = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
JOB_LABEL = "heterotrain.io/job"
EXIT_CODE_ANNOTATION = "heterotrain.io/testbed-exit-code"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def example_gpu_classes() -> list[dict[str, Any]]:
    """The example GPU classes, tolerating the test bed's fake-node taint."""
    text = (REPO_ROOT / "examples" / "gpuclasses.yaml").read_text()
    classes = [doc for doc in yaml.safe_load_all(text) if doc]
    for gpu_class in classes:
        gpu_class["spec"]["tolerations"] = [copy.deepcopy(TOLERATE_KWOK)]
    return classes


def example_job() -> dict[str, Any]:
    job: dict[str, Any] = yaml.safe_load((REPO_ROOT / "examples" / "job-digits.yaml").read_text())
    return job


@pytest.fixture
def chart_release(testbed: Testbed, namespace: str, tmp_path: Path) -> Iterator[str]:
    """ServiceAccount and RBAC from the chart; the CRDs are the test bed's, the classes the examples'."""
    values = {
        "crds": {"enabled": False},
        "gpuClasses": {"enabled": False},
        "dashboards": {"enabled": False},
        "watchNamespaces": [namespace],
    }
    home = tmp_path / "helm"
    kubeconfig = str(testbed.kubeconfig)
    install_chart(RELEASE, namespace, kubeconfig, values, home)
    testbed.apply_objects(example_gpu_classes())
    try:
        yield namespace
    finally:
        helm("uninstall", RELEASE, "-n", namespace, "--kubeconfig", kubeconfig, home=home, check=False)


@pytest.fixture
def operator_log(testbed: Testbed, chart_release: str, tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """`heterotrain operator` as the chart's ServiceAccount; yields its log and API port."""
    namespace = chart_release
    kubeconfig = service_account_kubeconfig(testbed, namespace, ACCOUNT, tmp_path / "sa.kubeconfig")
    log = tmp_path / "operator.log"
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "hetero_operator",
        "operator",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        namespace,
        "--metrics-port",
        str(free_port()),
        "--api-port",
        str(port),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    try:
        yield log, port
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
        print(f"--- operator log ({log}) ---\n{log.read_text(errors='replace')[-4000:]}")


def _probes(testbed: Testbed, namespace: str) -> dict[str, str]:
    """The probe paths of the chart's Deployment; both must be on the port the API listens on."""
    deployment = get_json(testbed, "deployment", f"{RELEASE}-heterotrain", "-n", namespace)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    api_port = next(p for p in container["ports"] if p["name"] == "api")["containerPort"]
    assert f"--api-port={api_port}" in container["args"]
    paths = {}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"]["port"] == "api", probe
        paths[probe] = str(container[probe]["httpGet"]["path"])
    return paths


def _answers(url: str) -> int:
    try:
        return httpx.get(url, timeout=5).status_code
    except httpx.HTTPError:
        return 0


def test_operator_under_the_chart_service_account_runs_a_job_to_success(
    testbed: Testbed, chart_release: str, operator_log: tuple[Path, int]
) -> None:
    namespace = chart_release
    log, port = operator_log
    job = example_job()
    name = job["metadata"]["name"]
    testbed.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(job))

    def status() -> dict[str, Any]:
        found: dict[str, Any] = get_json(testbed, "heterotrainjob", name, "-n", namespace).get("status") or {}
        return found

    def workers() -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = get_json(testbed, "pods", "-n", namespace, "-l", f"{JOB_LABEL}={name}")[
            "items"
        ]
        return pods

    # The chart's probes, as the API server stored its Deployment, answer on the API port once the
    # operator has synced (the job cannot run before its first scheduling cycle anyway).
    probes = _probes(testbed, namespace)
    api = f"http://127.0.0.1:{port}"
    ready_url, alive_url = api + probes["readinessProbe"], api + probes["livenessProbe"]
    wait_until(lambda: _answers(ready_url) == 200, "the operator to be ready", timeout=60)
    ready = httpx.get(ready_url, timeout=5).json()
    assert ready == {"ready": True, "checks": {"kubernetes": "ok", "inventory": "ok"}}
    alive = httpx.get(alive_url, timeout=5).json()
    assert alive == {"status": "ok", "checks": {"eventLoop": "ok", "schedulingLoop": "ok"}}

    try:
        wait_until(lambda: status().get("phase") == "Running", "the job to run", timeout=90)
    except AssertionError as waited_too_long:
        # The job's conditions say why it waits (an UnknownQueue left by another test, say).
        raise AssertionError(f"{waited_too_long}; status: {status()}") from None
    pods = workers()
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    assert len(pods) == len(status()["allocation"]["workers"])

    # Every worker exits 0 (the test bed's KWOK stages finish a pod on this annotation).
    testbed.kubectl(
        "annotate", "pods", "-n", namespace, "-l", f"{JOB_LABEL}={name}", f"{EXIT_CODE_ANNOTATION}=0"
    )
    wait_until(lambda: status().get("phase") == "Succeeded", "the job to succeed", timeout=90)

    assert _answers(alive_url) == 200

    # Deleting the job runs the operator's finalizer, which needs its delete permissions.
    testbed.kubectl("delete", "heterotrainjob", name, "-n", namespace, "--timeout=60s")
    wait_until(lambda: not workers(), "the workers to be deleted", timeout=60)

    text = log.read_text(errors="replace")
    assert "Forbidden" not in text and " 403" not in text, text[-3000:]
