"""`helm install` of the chart into the live test bed, and `helm uninstall` keeping the CRDs.

The test bed has no kubelet for the operator's pod (its nodes are KWOK's), so nothing waits for the
Deployment to become ready: the test checks the objects the API server accepted.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_helpers import adopt_crds_into_release, get_json
from helm_chart import helm, install_chart

from hetero_operator.dashboards import DASHBOARDS
from hetero_operator.ship.chart_crds import chart_crds
from hetero_operator.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed

RELEASE = "ht"
PRESETS = {"h100", "a100", "l4", "v100", "t4"}
CRD_NAMES = [crd["metadata"]["name"] for crd in chart_crds().values()]
# Two replicas: the install also creates the kopf peering object, after its CRD.
VALUES = {"replicaCount": 2}


@pytest.fixture
def helm_home(tmp_path: Path) -> Path:
    return tmp_path / "helm"


@pytest.fixture
def release(testbed: Testbed, namespace: str, helm_home: Path) -> Iterator[str]:
    """The chart installed as a namespaced release; hook objects it leaves behind are removed after."""
    kubeconfig = str(testbed.kubeconfig)
    adopt_crds_into_release(testbed, CRD_NAMES, RELEASE, namespace)
    result = install_chart(RELEASE, namespace, kubeconfig, VALUES, helm_home)
    assert "kubectl get htj" in result.stdout  # NOTES.txt
    try:
        yield namespace
    finally:
        helm(
            "uninstall",
            RELEASE,
            "--namespace",
            namespace,
            "--kubeconfig",
            kubeconfig,
            home=helm_home,
            check=False,
        )
        selector = f"app.kubernetes.io/instance={RELEASE}"
        for kind in ("gpuclasses.heterotrain.io", "clusterkopfpeerings.kopf.dev"):
            testbed.kubectl("delete", kind, "-l", selector, "--ignore-not-found", check=False)


def test_install_creates_every_object_and_uninstall_keeps_the_crds(
    testbed: Testbed, release: str, helm_home: Path
) -> None:
    namespace = release
    fullname = f"{RELEASE}-heterotrain"
    deployment = get_json(testbed, "deployment", fullname, "-n", namespace)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == fullname
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert f"--peering={fullname}" in pod["containers"][0]["args"]

    service = get_json(testbed, "service", fullname, "-n", namespace)
    assert {p["name"] for p in service["spec"]["ports"]} == {"metrics", "api"}
    get_json(testbed, "serviceaccount", fullname, "-n", namespace)
    role = get_json(testbed, "clusterrole", f"{fullname}-cluster")
    assert role["rules"]
    get_json(testbed, "clusterrolebinding", f"{fullname}-cluster")
    config_maps = get_json(testbed, "configmap", "-n", namespace, "-l", "grafana_dashboard=1")["items"]
    assert sorted(key for c in config_maps for key in c["data"]) == sorted(DASHBOARDS)

    # The hooks ran after the CRDs: the API server accepted every preset and the peering object.
    classes = get_json(testbed, "gpuclasses", "-l", f"app.kubernetes.io/instance={RELEASE}")["items"]
    assert {c["metadata"]["name"] for c in classes} == PRESETS
    get_json(testbed, "clusterkopfpeering", fullname)
    for name in CRD_NAMES:
        crd = get_json(testbed, "crd", name)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])

    # The API server's own answer on what the ServiceAccount may do.
    account = f"system:serviceaccount:{namespace}:{fullname}"

    def can(*args: str) -> bool:
        result = testbed.kubectl("auth", "can-i", *args, f"--as={account}", check=False)
        return result.stdout.strip() == "yes"

    assert can("create", "pods", "-n", "anywhere")
    assert can("patch", "heterotrainjobs.heterotrain.io", "--subresource=status", "-n", "anywhere")
    assert can("watch", "gpuclasses.heterotrain.io")
    assert can("patch", "clusterkopfpeerings.kopf.dev")
    assert not can("get", "secrets", "-n", namespace)
    assert not can("delete", "nodes")
    assert not can("create", "gpuclasses.heterotrain.io")

    helm(
        "uninstall",
        RELEASE,
        "--namespace",
        namespace,
        "--kubeconfig",
        str(testbed.kubeconfig),
        home=helm_home,
    )
    assert testbed.kubectl("get", "deployment", fullname, "-n", namespace, check=False).returncode != 0
    assert testbed.kubectl("get", "clusterrole", f"{fullname}-cluster", check=False).returncode != 0
    for name in CRD_NAMES:
        assert testbed.kubectl("get", "crd", name, check=False).returncode == 0, f"{name} was deleted"
