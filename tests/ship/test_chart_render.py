"""The chart, rendered without a cluster: lint, every toggle, schemas, RBAC, and one source for the CRDs
and dashboards."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_chart import CHART, Manifest, helm, of_kind, one, render, validate
from pydantic.alias_generators import to_camel

from hetero_operator.cli.operator import parse_settings
from hetero_operator.controller.job_conditions import ConditionType
from hetero_operator.controller.kueue_proposals import AdmittedReason
from hetero_operator.dashboards import DASHBOARDS
from hetero_operator.manager.settings import CHART_GROUPS, OperatorSettings
from hetero_operator.resources import GPUClass
from hetero_operator.resources.crd import all_crds
from hetero_operator.scheduler import WaitCode
from hetero_operator.ship.chart_crds import KEEP_ANNOTATION, stale_files
from hetero_operator.ship.chart_crds import main as chart_crds_main
from hetero_operator.ship.chart_values import VALUES
from hetero_operator.ship.chart_values import main as chart_values_main
from hetero_operator.ship.peering_crds import peering_crds

CRD_TEMPLATES = CHART / "templates" / "crds"
PRESETS = {"h100", "a100", "l4", "v100", "t4"}

# Every toggle of values.yaml, each alone, plus the combinations that change the RBAC layout.
TOGGLES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "no-crds": {"crds": {"enabled": False}},
    "ha-cluster-wide": {"replicaCount": 3},
    "namespaced": {"watchNamespaces": ["team-a", "team-b"]},
    "ha-namespaced": {"replicaCount": 2, "watchNamespaces": ["team-a", "team-b"]},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "rebalancing": {"prometheus": {"url": "http://prometheus.monitoring:9090"}},
    "pod-monitor": {"podMonitor": {"enabled": True}},
    "pod-monitor-namespaced": {"podMonitor": {"enabled": True}, "watchNamespaces": ["team-a"]},
    "no-dashboards": {"dashboards": {"enabled": False}},
    "dashboards-elsewhere": {"dashboards": {"namespace": "grafana", "annotations": {"grafana_folder": "ht"}}},
    "no-gpu-classes": {"gpuClasses": {"enabled": False}},
    "gpu-classes-edited": {
        "gpuClasses": {
            "presets": {
                "t4": {"enabled": False},
                "l4": {"relativeSpeed": 0.4},
                "mi300": {
                    "enabled": True,
                    "nodeSelector": {"amd.com/gpu.product": "MI300X"},
                    "resourceName": "amd.com/gpu",
                    "memoryGiB": 192,
                    "relativeSpeed": 1.8,
                },
            }
        }
    },
    "existing-service-account": {"serviceAccount": {"create": False, "name": "ops"}},
    "no-rbac": {"rbac": {"create": False}},
    "network-policy": {
        "operator": {
            "settings": {"launch": {"networkPolicy": {"enabled": True, "prometheusNamespace": "mon"}}}
        }
    },
    "kueue": {"kueue": {"enabled": True, "reproposeAfterSeconds": 120}},
    "kueue-namespaced": {"kueue": {"enabled": True}, "watchNamespaces": ["team-a"]},
    "verbose-extra": {
        "operator": {
            "verbose": True,
            "settings": {"lifecycle": {"checkpointGraceSeconds": 120}, "scheduler": {"elastic": False}},
            "extraArgs": ["--flag"],
            "extraEnv": [{"name": "A", "value": "1"}],
        },
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "ops", "operator": "Exists"}],
        "podAnnotations": {"a": "b"},
        "imagePullSecrets": [{"name": "regcred"}],
        "priorityClassName": "system-cluster-critical",
    },
}


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


@pytest.fixture(scope="module")
def rendered(helm_home: Path) -> dict[str, list[Manifest]]:
    return {name: render(values, helm_home) for name, values in TOGGLES.items()}


def container(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = one(manifests, "Deployment")
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_helm_lint_is_clean(helm_home: Path) -> None:
    result = helm("lint", "--strict", str(CHART), home=helm_home)
    assert "0 chart(s) failed" in result.stdout
    for values in (TOGGLES["ha-namespaced"], TOGGLES["gpu-classes-edited"]):
        helm("lint", "--strict", str(CHART), "-f", "-", home=helm_home, input=yaml.safe_dump(values))


@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_every_manifest_fits_its_schema(rendered: dict[str, list[Manifest]], toggle: str) -> None:
    manifests = rendered[toggle]
    assert manifests
    for manifest in manifests:
        validate(manifest)


def test_schema_validation_rejects_a_misspelt_field(rendered: dict[str, list[Manifest]]) -> None:
    deployment = one(rendered["defaults"], "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePulPolicy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(broken)


def test_defaults(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["defaults"]
    kinds = sorted(m["kind"] for m in manifests)
    assert kinds.count("CustomResourceDefinition") == 6
    assert kinds.count("ConfigMap") == len(DASHBOARDS)
    for kind in ("Deployment", "ServiceAccount", "Service", "ClusterRole", "ClusterRoleBinding"):
        assert kinds.count(kind) == 1, kind
    for absent in (
        "Role",
        "RoleBinding",
        "ServiceMonitor",
        "PodMonitor",
        "ClusterKopfPeering",
        "KopfPeering",
    ):
        assert absent not in kinds
    deployment = one(manifests, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    main = container(manifests)
    assert main["image"] == "heterotrain/operator:0.1.0"
    assert main["args"][:2] == ["--metrics-port=8080", "--api-port=8443"]
    assert "--lifecycle.checkpoint-grace-seconds=30" in main["args"]
    assert {p["name"] for p in main["ports"]} == {"metrics", "api"}
    service = one(manifests, "Service")
    assert {p["targetPort"] for p in service["spec"]["ports"]} == {"metrics", "api"}
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_operator_runs_locked_down(rendered: dict[str, list[Manifest]]) -> None:
    pod = one(rendered["defaults"], "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(rendered["defaults"])["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    main = container(rendered["defaults"])
    assert {"cpu", "memory"} <= set(main["resources"]["requests"])
    # The probes ask the operator's HTTP API, whose /healthz and /readyz check the operator itself.
    assert "--api-port=8443" in main["args"]
    assert {p["name"]: p["containerPort"] for p in main["ports"]}["api"] == 8443
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api"}
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]


def test_every_argument_the_chart_passes_is_an_operator_option(rendered: dict[str, list[Manifest]]) -> None:
    for name, manifests in rendered.items():
        extra = TOGGLES[name].get("operator", {}).get("extraArgs", [])
        args = [arg for arg in container(manifests)["args"] if arg not in extra]
        parse_settings(args)  # refuses any option the operator does not have, naming it
    args = container(rendered["verbose-extra"])["args"]
    assert "--lifecycle.checkpoint-grace-seconds=120" in args and "--no-scheduler.elastic" in args


def test_the_chart_sets_every_setting_to_the_operators_own_default(
    rendered: dict[str, list[Manifest]],
) -> None:
    """`operator.settings` is generated from the settings model: rendered with the chart's defaults,
    it gives the operator exactly its defaults, group by group and field by field."""
    assert chart_values_main(["--check"]) == 0, (
        "values.yaml is stale: python -m hetero_operator.ship.chart_values"
    )
    parsed = parse_settings(container(rendered["defaults"])["args"])
    assert isinstance(parsed, OperatorSettings)
    defaults = OperatorSettings()
    for group in CHART_GROUPS:
        assert getattr(parsed, group) == getattr(defaults, group), group
    values = yaml.safe_load(VALUES.read_text())["operator"]["settings"]
    assert set(values) == set(CHART_GROUPS)
    for group in CHART_GROUPS:
        fields = {to_camel(f.name) for f in dataclasses.fields(getattr(defaults, group))}
        assert set(values[group]) == fields, group


def test_a_prometheus_url_turns_rebalancing_on(rendered: dict[str, list[Manifest]]) -> None:
    assert "--prometheus-url=http://prometheus.monitoring:9090" in container(rendered["rebalancing"])["args"]
    assert not any(a.startswith("--prometheus-url") for a in container(rendered["defaults"])["args"])


def test_more_than_one_replica_elects_a_leader_through_kopf_peering(
    rendered: dict[str, list[Manifest]],
) -> None:
    manifests = rendered["ha-cluster-wide"]
    peering = one(manifests, "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in container(manifests)["args"]
    assert one(manifests, "Deployment")["spec"]["strategy"]["type"] == "RollingUpdate"
    # Created after its CRD: a hook, so a first install on an empty cluster works.
    assert "post-install" in peering["metadata"]["annotations"]["helm.sh/hook"]
    env = {e["name"]: e for e in container(manifests)["env"]}
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    namespaced = rendered["ha-namespaced"]
    peerings = of_kind(namespaced, "KopfPeering")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["team-a", "team-b"]
    assert not of_kind(namespaced, "ClusterKopfPeering")
    args = container(namespaced)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert f"--peering={peerings[0]['metadata']['name']}" in args


def test_one_replica_runs_without_peering(rendered: dict[str, list[Manifest]]) -> None:
    assert not any(arg.startswith("--peering") for arg in container(rendered["namespaced"])["args"])


def rules_of(manifest: Manifest) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples a Role or ClusterRole grants."""
    return {
        (group, resource, verb)
        for rule in manifest["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


NAMESPACED_GRANTS = {
    *{("heterotrain.io", "heterotrainjobs", v) for v in ("get", "list", "watch", "patch")},
    ("heterotrain.io", "heterotrainjobs/status", "get"),
    ("heterotrain.io", "heterotrainjobs/status", "patch"),
    ("heterotrain.io", "heterotrainjobs/finalizers", "update"),
    *{
        ("", r, v)
        for r in ("pods", "services", "configmaps", "persistentvolumeclaims")
        for v in ("get", "list", "watch", "create", "delete", "patch")
    },
    ("", "pods", "deletecollection"),
    ("", "events", "create"),
}
CLUSTER_GRANTS = {
    *{("heterotrain.io", "gpuclasses", v) for v in ("get", "list", "watch")},
    ("heterotrain.io", "gpuclasses/status", "patch"),
    *{("heterotrain.io", "heteroqueues", v) for v in ("get", "list", "watch")},
    ("heterotrain.io", "heteroqueues/status", "patch"),
    *{("heterotrain.io", "workloadprofiles", v) for v in ("get", "list", "watch", "create")},
    ("heterotrain.io", "workloadprofiles/status", "patch"),
    *{("", "nodes", v) for v in ("get", "list", "watch")},
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}


def peering_grants(plural: str) -> set[tuple[str, str, str]]:
    return {("kopf.dev", plural, v) for v in ("get", "list", "watch", "patch")}


def test_cluster_wide_rbac_is_exactly_what_the_operator_uses(rendered: dict[str, list[Manifest]]) -> None:
    role = one(rendered["defaults"], "ClusterRole")
    assert rules_of(role) == CLUSTER_GRANTS | NAMESPACED_GRANTS | peering_grants("clusterkopfpeerings")
    binding = one(rendered["defaults"], "ClusterRoleBinding")
    account = one(rendered["defaults"], "ServiceAccount")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "heterotrain-system"}
    ]
    assert (
        one(rendered["defaults"], "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        == (account["metadata"]["name"])
    )


def test_per_job_network_policies_are_switched_on_with_their_grant(
    rendered: dict[str, list[Manifest]],
) -> None:
    args = container(rendered["network-policy"])["args"]
    assert "--launch.network-policy.enabled" in args or "--launch.network-policy.enabled=true" in args, args
    assert "--launch.network-policy.prometheus-namespace=mon" in args, args
    grants = {
        ("networking.k8s.io", "networkpolicies", v)
        for v in ("get", "list", "watch", "create", "delete", "patch")
    }
    assert grants <= rules_of(one(rendered["network-policy"], "ClusterRole"))
    assert not grants & rules_of(one(rendered["defaults"], "ClusterRole"))


def test_watching_namespaces_narrows_rbac_to_roles(rendered: dict[str, list[Manifest]]) -> None:
    manifests = rendered["namespaced"]
    assert rules_of(one(manifests, "ClusterRole")) == CLUSTER_GRANTS
    roles = of_kind(manifests, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rules_of(role) == NAMESPACED_GRANTS | peering_grants("kopfpeerings")
    bindings = of_kind(manifests, "RoleBinding")
    assert sorted((b["metadata"]["namespace"], b["roleRef"]["kind"]) for b in bindings) == [
        ("team-a", "Role"),
        ("team-b", "Role"),
    ]


def test_no_grant_is_a_wildcard_or_touches_secrets(rendered: dict[str, list[Manifest]]) -> None:
    for manifests in rendered.values():
        for role in of_kind(manifests, "ClusterRole") + of_kind(manifests, "Role"):
            for group, resource, verb in rules_of(role):
                assert "*" not in (group, resource, verb)
                assert resource not in {"secrets", "serviceaccounts/token"}
                assert verb not in {"escalate", "bind", "impersonate"}


def test_rbac_and_service_account_toggles(rendered: dict[str, list[Manifest]]) -> None:
    assert not of_kind(rendered["no-rbac"], "ClusterRole")
    assert not of_kind(rendered["no-rbac"], "ClusterRoleBinding")
    existing = rendered["existing-service-account"]
    assert not of_kind(existing, "ServiceAccount")
    assert one(existing, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert one(existing, "ClusterRoleBinding")["subjects"][0]["name"] == "ops"


def test_monitors_select_the_operator_service_and_the_worker_pods(
    rendered: dict[str, list[Manifest]],
) -> None:
    service_monitor = one(rendered["service-monitor"], "ServiceMonitor")
    service = one(rendered["service-monitor"], "Service")
    selected = service_monitor["spec"]["selector"]["matchLabels"]
    assert selected.items() <= service["metadata"]["labels"].items()
    assert service_monitor["metadata"]["labels"]["release"] == "prom"
    assert service_monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}
    # Per-job operator series carry the job's namespace; the target's own must not rename it.
    assert service_monitor["spec"]["endpoints"][0]["honorLabels"] is True
    pod_monitor = one(rendered["pod-monitor"], "PodMonitor")
    # The launcher labels every worker pod so, and names its metrics port "metrics".
    assert pod_monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "heterotrain-operator"
    }
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["spec"]["namespaceSelector"] == {"any": True}
    narrowed = one(rendered["pod-monitor-namespaced"], "PodMonitor")
    assert narrowed["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
    assert not of_kind(rendered["defaults"], "ServiceMonitor") and not of_kind(
        rendered["defaults"], "PodMonitor"
    )


def test_dashboard_configmaps_carry_the_checked_in_json_and_the_sidecar_label(
    rendered: dict[str, list[Manifest]],
) -> None:
    config_maps = of_kind(rendered["defaults"], "ConfigMap")
    shipped = {}
    for config_map in config_maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        for key, text in config_map["data"].items():
            shipped[key] = json.loads(text)
    assert shipped == {name: json.loads((CHART / "dashboards" / name).read_text()) for name in DASHBOARDS}
    elsewhere = of_kind(rendered["dashboards-elsewhere"], "ConfigMap")
    assert {c["metadata"]["namespace"] for c in elsewhere} == {"grafana"}
    assert all(c["metadata"]["annotations"] == {"grafana_folder": "ht"} for c in elsewhere)
    assert not of_kind(rendered["no-dashboards"], "ConfigMap")


def test_gpu_class_presets_are_valid_and_each_overridable(rendered: dict[str, list[Manifest]]) -> None:
    presets = {m["metadata"]["name"]: GPUClass.from_k8s(m) for m in of_kind(rendered["defaults"], "GPUClass")}
    assert set(presets) == PRESETS
    speeds = {name: preset.spec.relative_speed for name, preset in presets.items()}
    assert speeds["a100"] == 1.0
    assert speeds["h100"] > speeds["a100"] > speeds["v100"] > speeds["t4"]
    for preset in presets.values():
        assert set(preset.spec.node_selector) == {"nvidia.com/gpu.product"}
    edited = {
        m["metadata"]["name"]: GPUClass.from_k8s(m)
        for m in of_kind(rendered["gpu-classes-edited"], "GPUClass")
    }
    assert set(edited) == PRESETS - {"t4"} | {"mi300"}
    assert edited["l4"].spec.relative_speed == 0.4
    assert edited["mi300"].spec.resource_name == "amd.com/gpu"
    assert not of_kind(rendered["no-gpu-classes"], "GPUClass")


def test_chart_crds_are_the_generator_output_kept_on_uninstall(rendered: dict[str, list[Manifest]]) -> None:
    assert stale_files(CRD_TEMPLATES) == [], "run: python -m hetero_operator.ship.chart_crds"
    crds = {m["metadata"]["name"]: m for m in of_kind(rendered["defaults"], "CustomResourceDefinition")}
    expected = {crd["metadata"]["name"]: crd for crd in (*all_crds().values(), *peering_crds().values())}
    assert crds.keys() == expected.keys()
    for name, crd in crds.items():
        assert crd["metadata"]["annotations"] == KEEP_ANNOTATION
        without_annotation = {**crd, "metadata": {"name": name}}
        assert without_annotation == expected[name]
    assert not of_kind(rendered["no-crds"], "CustomResourceDefinition")


def test_chart_crds_cli_writes_and_checks(tmp_path: Path) -> None:
    assert chart_crds_main(["--out", str(tmp_path), "--check"]) == 1
    assert chart_crds_main(["--out", str(tmp_path)]) == 0
    assert chart_crds_main(["--out", str(tmp_path), "--check"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in CRD_TEMPLATES.iterdir())


def test_install_guide_names_files_that_exist() -> None:
    guide = (CHART.parents[1] / "docs" / "install.md").read_text()
    paths = set(re.findall(r"(?:helm/heterotrain|trainer_image|examples)/[\w./-]*\w", guide))
    assert {"helm/heterotrain/dashboards/gpu-pools.json", "trainer_image/Dockerfile"} <= paths
    for path in paths:
        assert (CHART.parents[1] / path).exists(), path


def test_install_guide_explains_every_condition_a_job_can_carry() -> None:
    guide = (CHART.parents[1] / "docs" / "install.md").read_text()
    table = guide[guide.index("### Reading a job's status") :]
    rows = {line.split("|")[1].strip(" `") for line in table.splitlines() if line.startswith("| `")}
    assert rows == set(ConditionType)
    placed = next(line for line in table.splitlines() if line.startswith("| `Placed`"))
    assert all(f"`{code.value}`" in placed for code in WaitCode), "every reason a job waits for is explained"
    admitted = next(line for line in table.splitlines() if line.startswith("| `Admitted`"))
    assert all(f"`{reason.value}`" in admitted for reason in AdmittedReason), "every Kueue state is explained"
