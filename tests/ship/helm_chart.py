"""Run the test bed's helm on the chart and check what it renders."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from hetero_operator.resources import GPUClass
from hetero_operator.ship.peering_crds import PEERING_API_VERSION, peering_crds
from hetero_operator.testbed import build

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "helm" / "heterotrain"
# The newest Kubernetes schemas kubernetes-validate ships at or below the test bed's release.
KUBERNETES_VERSION = "1.36"

Manifest = dict[str, Any]


def helm(
    *args: str, home: Path, input: str | None = None, check: bool = True, timeout: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """helm with its cache, config and data under `home`, so runs never touch the user's helm setup."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    result = subprocess.run(
        [str(build.binary("helm")), *args],
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def install_chart(
    release: str, namespace: str, kubeconfig: str, values: Mapping[str, Any], home: Path
) -> subprocess.CompletedProcess[str]:
    """`helm install` of the chart into `namespace` with `values`."""
    return helm(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kubeconfig",
        kubeconfig,
        "-f",
        "-",
        home=home,
        input=yaml.safe_dump(dict(values)),
    )


def render(
    values: Mapping[str, Any], home: Path, release: str = "ht", namespace: str = "heterotrain-system"
) -> list[Manifest]:
    """`helm template` with `values`, as a list of objects (empty documents dropped)."""
    result = helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "-f",
        "-",
        home=home,
        input=yaml.safe_dump(dict(values)),
    )
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def of_kind(manifests: Sequence[Manifest], kind: str) -> list[Manifest]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: Sequence[Manifest], kind: str) -> Manifest:
    found = of_kind(manifests, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


# kubernetes-validate knows only Kubernetes' own kinds. The Prometheus Operator's two kinds are
# checked against the fields this chart relies on (the full CRDs are not ours to ship).
_SELECTOR = {
    "type": "object",
    "required": ["matchLabels"],
    "properties": {
        "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}
    },
    "additionalProperties": False,
}
_NAMESPACE_SELECTOR = {
    "type": "object",
    "oneOf": [
        {"required": ["any"], "properties": {"any": {"const": True}}, "additionalProperties": False},
        {
            "required": ["matchNames"],
            "properties": {"matchNames": {"type": "array", "minItems": 1, "items": {"type": "string"}}},
            "additionalProperties": False,
        },
    ],
}
_ENDPOINT = {
    "type": "object",
    "required": ["port", "path", "interval"],
    "properties": {
        "port": {"type": "string", "minLength": 1},
        "path": {"type": "string", "pattern": "^/"},
        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
        "honorLabels": {"type": "boolean"},
    },
    "additionalProperties": False,
}


def _monitor_schema(endpoints_field: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "metadata": {"type": "object", "required": ["name", "namespace"]},
            "spec": {
                "type": "object",
                "required": ["selector", "namespaceSelector", endpoints_field],
                "properties": {
                    "selector": _SELECTOR,
                    "namespaceSelector": _NAMESPACE_SELECTOR,
                    endpoints_field: {"type": "array", "minItems": 1, "items": _ENDPOINT},
                },
                "additionalProperties": False,
            },
        },
    }


MONITOR_SCHEMAS = {
    "ServiceMonitor": _monitor_schema("endpoints"),
    "PodMonitor": _monitor_schema("podMetricsEndpoints"),
}


def validate(manifest: Manifest) -> None:
    """Raise if `manifest` does not fit its kind's schema. Each kind outside Kubernetes' own is handled
    explicitly: our GPUClass by its pydantic model, kopf's peering objects by their CRD's schema, the
    Prometheus Operator's monitors by the schemas above."""
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    if api_version == "heterotrain.io/v1alpha1" and kind == "GPUClass":
        GPUClass.from_k8s(manifest)
    elif api_version == PEERING_API_VERSION:
        crd = peering_crds()[f"{kind.lower()}s.kopf.dev.yaml"]
        jsonschema.validate(manifest, crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    elif api_version == "monitoring.coreos.com/v1":
        jsonschema.validate(manifest, MONITOR_SCHEMAS[kind])
    else:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
