"""The chart with the Kueue integration on (`kueue.enabled`), and the install guide's Kueue setup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helm_chart import CHART, Manifest, of_kind, render
from test_chart_render import CLUSTER_GRANTS, NAMESPACED_GRANTS, container, peering_grants, rules_of

from hetero_operator.controller.facts import ClassFacts
from hetero_operator.kueue.constants import QUEUE_NAME_LABEL
from hetero_operator.kueue.facts import ClusterQueueFacts, FlavorFacts
from hetero_operator.kueue.quota import class_quotas
from hetero_operator.resources import GPUClass

KUEUE_VALUES = {
    "defaults": {},
    "kueue": {"kueue": {"enabled": True, "reproposeAfterSeconds": 120}},
    "kueue-namespaced": {"kueue": {"enabled": True}, "watchNamespaces": ["team-a"]},
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Manifest]]:
    home: Path = tmp_path_factory.mktemp("helm-home")
    return {name: render(values, home) for name, values in KUEUE_VALUES.items()}


KUEUE_CLUSTER_GRANTS = {
    ("kueue.x-k8s.io", r, v) for r in ("clusterqueues", "resourceflavors") for v in ("get", "list", "watch")
}
KUEUE_NAMESPACED_GRANTS = {
    *{("kueue.x-k8s.io", "workloads", v) for v in ("get", "list", "watch", "create", "delete", "patch")},
    ("kueue.x-k8s.io", "workloads/status", "patch"),
    *{("kueue.x-k8s.io", "localqueues", v) for v in ("get", "list", "watch")},
}


def test_the_kueue_value_passes_the_option_and_grants_exactly_what_the_integration_uses(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["kueue"]
    args = container(manifests)["args"]
    assert "--kueue.enabled" in args and "--kueue.repropose-after-seconds=120" in args
    operator_role, kueue_role = sorted(of_kind(manifests, "ClusterRole"), key=lambda r: r["metadata"]["name"])
    assert rules_of(operator_role) == (
        CLUSTER_GRANTS
        | NAMESPACED_GRANTS
        | peering_grants("clusterkopfpeerings")
        | KUEUE_CLUSTER_GRANTS
        | KUEUE_NAMESPACED_GRANTS
    )
    # Kueue's controller reads the job that owns a Workload, and nothing else.
    assert kueue_role["metadata"]["name"].endswith("-kueue")
    assert rules_of(kueue_role) == {("heterotrain.io", "heterotrainjobs", "get")}
    binding = next(
        b
        for b in of_kind(manifests, "ClusterRoleBinding")
        if b["roleRef"]["name"] == kueue_role["metadata"]["name"]
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "kueue-controller-manager", "namespace": "kueue-system"}
    ]
    namespaced = rendered["kueue-namespaced"]
    cluster_roles = {r["metadata"]["name"]: r for r in of_kind(namespaced, "ClusterRole")}
    operator_cluster = next(r for n, r in cluster_roles.items() if n.endswith("-cluster"))
    assert rules_of(operator_cluster) == CLUSTER_GRANTS | KUEUE_CLUSTER_GRANTS
    (role,) = of_kind(namespaced, "Role")
    assert rules_of(role) == NAMESPACED_GRANTS | peering_grants("kopfpeerings") | KUEUE_NAMESPACED_GRANTS
    # Off (the default): no Kueue grant, no option.
    defaults = rendered["defaults"]
    assert not any(g == "kueue.x-k8s.io" for r in of_kind(defaults, "ClusterRole") for g, _, _ in rules_of(r))
    assert not any(a.startswith("--kueue") for a in container(defaults)["args"])


def test_install_guide_kueue_queues_offer_every_class_of_its_first_job() -> None:
    """The guide's ResourceFlavors select the chart's GPU classes, and the quota matching the
    operator does gives the guide's job a quota for each of its classes."""
    guide = (CHART.parents[1] / "docs" / "install.md").read_text()
    section = guide[guide.index("### Under Kueue") : guide.index("### Reading a job's status")]
    objects = [
        d for block in re.findall(r"```yaml\n(.*?)```", section, re.S) for d in yaml.safe_load_all(block) if d
    ]
    by_kind: dict[str, list[Manifest]] = {}
    for manifest in objects:
        by_kind.setdefault(manifest["kind"], []).append(manifest)
    presets = yaml.safe_load((CHART / "values.yaml").read_text())["gpuClasses"]["presets"]
    flavors = {f["metadata"]["name"]: FlavorFacts.from_body(f) for f in by_kind["ResourceFlavor"]}
    for name, flavor in flavors.items():
        assert flavor.node_labels == presets[name]["nodeSelector"], name
    (queue,) = by_kind["ClusterQueue"]
    (local,) = by_kind["LocalQueue"]
    (job,) = by_kind["HeteroTrainJob"]
    assert local["spec"]["clusterQueue"] == queue["metadata"]["name"]
    assert job["metadata"]["labels"][QUEUE_NAME_LABEL] == local["metadata"]["name"]
    assert job["metadata"]["namespace"] == local["metadata"]["namespace"]
    classes = [
        ClassFacts.from_model(
            GPUClass.from_k8s(
                {
                    "apiVersion": "heterotrain.io/v1alpha1",
                    "kind": "GPUClass",
                    "metadata": {"name": name},
                    "spec": {k: v for k, v in presets[name].items() if k != "enabled"},
                }
            )
        )
        for name in job["spec"]["gpuClasses"]
    ]
    quotas = class_quotas(ClusterQueueFacts.from_body(queue), flavors, classes)
    assert {name: q.flavor for name, q in quotas.items()} == {c.name: c.name for c in classes}
    assert all(q.nominal > 0 for q in quotas.values())
