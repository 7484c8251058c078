"""Helpers for tests that install the chart into the test bed."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hetero_operator.testbed.cluster import Testbed

HELM_OWNERSHIP_LABEL = "app.kubernetes.io/managed-by=Helm"


def adopt_crds_into_release(testbed: Testbed, crd_names: list[str], release: str, namespace: str) -> None:
    """Let a release take over CRDs that already exist (the test bed applies ours with kubectl):
    Helm adopts an object that carries its ownership label and annotations."""
    present = set(
        testbed.kubectl("get", "crd", "-o", "name")
        .stdout.replace("customresourcedefinition.apiextensions.k8s.io/", "")
        .split()
    )
    for name in sorted(set(crd_names) & present):
        testbed.kubectl("label", "crd", name, HELM_OWNERSHIP_LABEL, "--overwrite")
        testbed.kubectl(
            "annotate",
            "crd",
            name,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
            "--overwrite",
        )


def get_json(testbed: Testbed, *args: str) -> dict[str, Any]:
    result = testbed.kubectl("get", *args, "-o", "yaml")
    loaded: dict[str, Any] = yaml.safe_load(result.stdout)
    return loaded


def wait_until(check: Callable[[], bool], what: str, timeout: float, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def service_account_kubeconfig(testbed: Testbed, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount itself, with a token from the TokenRequest
    API: the operator's client then has exactly the account's permissions, as in a pod."""
    token = testbed.kubectl("create", "token", account, "-n", namespace, "--duration=1h").stdout.strip()
    admin = yaml.safe_load(testbed.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    assert base64.b64decode(cluster["certificate-authority-data"])
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed", "cluster": cluster}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [
            {"name": account, "context": {"cluster": "testbed", "user": account, "namespace": namespace}}
        ],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
