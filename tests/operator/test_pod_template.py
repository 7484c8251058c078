"""spec.template merged into the worker pods, refused where it reaches for the operator's fields, and
held to the administrator's guards; the optional per-job NetworkPolicy."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import kubernetes_validate
import pytest
from tests.operator.builders import allocation, job, job_body

from hetero_operator.controller import launcher
from hetero_operator.controller.facts import JobFacts
from hetero_operator.controller.network_policy import NetworkPolicyOptions
from hetero_operator.controller.pod_guards import WorkerGuards
from hetero_operator.controller.validation import job_problems
from hetero_operator.resources import InvalidResourceError

SETTINGS = launcher.LaunchSettings(metrics_port=9400, master_port=29500)
DATA = {"name": "data", "persistentVolumeClaim": {"claimName": "imagenet"}}
SIDECAR = {"name": "logs", "image": "fluent/fluent-bit:3", "args": ["-c", "/etc/fb.conf"]}
WORKER = {
    "name": "worker",
    "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
    "envFrom": [{"configMapRef": {"name": "train-config"}}],
    "env": [{"name": "SHARD", "value": "$(RANK)"}],
    "ports": [{"name": "debug", "containerPort": 5678}],
    "resources": {"limits": {"ephemeral-storage": "20Gi"}},
    "readinessProbe": {"exec": {"command": ["true"]}},
}


def pod_of(template: dict[str, Any], **spec: Any) -> dict[str, Any]:
    model = job(template=template, **spec)
    return launcher.worker_pods(model, allocation(("node-a", "fast")), SETTINGS)[0]


def problems_of(
    template: dict[str, Any], launch: launcher.LaunchOptions | None = None, **spec: Any
) -> list[str]:
    parsed, problems = job_problems(JobFacts.from_body(job_body(template=template, **spec)), launch)
    assert parsed is not None, problems
    return problems


def test_the_worker_entry_is_merged_and_sidecars_are_kept() -> None:
    pod = pod_of({"spec": {"volumes": [DATA], "containers": [WORKER, SIDECAR]}})
    worker, sidecar = pod["spec"]["containers"]
    assert sidecar == SIDECAR
    assert worker["name"] == "worker" and worker["image"] == "heterotrain/trainer:test"
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in worker["volumeMounts"]
    assert {"name": "plan", "mountPath": "/etc/heterotrain/plan", "readOnly": True} in worker["volumeMounts"]
    assert worker["envFrom"] == [{"configMapRef": {"name": "train-config"}}]
    assert [p["name"] for p in worker["ports"]] == ["rendezvous", "metrics", "debug"]
    assert worker["readinessProbe"] == {"exec": {"command": ["true"]}}
    names = [variable["name"] for variable in worker["env"]]
    assert names[-1] == "SHARD" and names.index("RANK") < names.index("SHARD")  # $(RANK) expands
    assert worker["resources"]["limits"] == {"ephemeral-storage": "20Gi", "nvidia.com/gpu": "1"}
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["plan", "podinfo", "tmp", "dshm", "data"]


def test_pod_fields_labels_and_added_capabilities_reach_the_pod() -> None:
    template = {
        "metadata": {"labels": {"team": "vision"}, "annotations": {"owner": "ana"}},
        "spec": {
            "affinity": {"podAntiAffinity": {}},
            "imagePullSecrets": [{"name": "regcred"}],
            "priorityClassName": "training",
            "securityContext": {"supplementalGroups": [4000]},
            "initContainers": [{"name": "fetch", "image": "busybox:1"}],
            "containers": [{"name": "worker", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}],
        },
    }
    pod = pod_of(template)
    assert pod["metadata"]["labels"]["team"] == "vision"
    assert pod["metadata"]["labels"]["heterotrain.io/job"] == "train"
    assert pod["metadata"]["annotations"]["owner"] == "ana"
    assert pod["spec"]["affinity"] == {"podAntiAffinity": {}}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["priorityClassName"] == "training"
    assert pod["spec"]["securityContext"]["supplementalGroups"] == [4000]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert pod["spec"]["initContainers"] == [{"name": "fetch", "image": "busybox:1"}]
    capabilities = pod["spec"]["containers"][0]["securityContext"]["capabilities"]
    assert capabilities == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert pod["spec"]["nodeName"] == "node-a" and pod["spec"]["restartPolicy"] == "Never"
    kubernetes_validate.validate(json.loads(json.dumps(pod)), "1.36", strict=True)


@pytest.mark.parametrize(
    ("template", "words"),
    [
        ({"spec": {"nodeName": "gpu-1"}}, "template.spec.nodeName must not be set"),
        ({"spec": {"restartPolicy": "Always"}}, "template.spec.restartPolicy must not be set"),
        ({"spec": {"containers": [{"name": "worker", "image": "x:1"}]}}, "must not set image"),
        (
            {"spec": {"containers": [{"name": "worker", "env": [{"name": "WORLD_SIZE", "value": "9"}]}]}},
            "got WORLD_SIZE",
        ),
        ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "got dshm"),
        ({"spec": {"containers": [{"name": "logs"}]}}, "no image: logs"),
    ],
)
def test_the_model_refuses_what_the_operator_owns_naming_it(template: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidResourceError) as raised:
        job(template=template)
    assert words in str(raised.value)


def test_pod_overrides_are_refused_naming_template() -> None:
    with pytest.raises(InvalidResourceError) as raised:
        job(podOverrides={"tolerations": []})
    assert "spec.podOverrides: podOverrides was replaced by template" in str(raised.value)


@pytest.mark.parametrize(
    ("template", "spec", "field"),
    [
        (
            {"spec": {"containers": [{"name": "worker", "env": [{"name": "LR", "value": "1"}]}]}},
            {"env": [{"name": "LR", "value": "2"}]},
            "spec.template.spec.containers[worker].env[LR]: also set in spec.env",
        ),
        (
            {
                "spec": {
                    "containers": [{"name": "worker", "volumeMounts": [{"name": "x", "mountPath": "/x"}]}]
                }
            },
            {},
            "spec.template.spec.containers[worker].volumeMounts[x]: no volume named 'x'",
        ),
        (
            {
                "spec": {
                    "volumes": [DATA],
                    "containers": [
                        {"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/tmp"}]}
                    ],
                }
            },
            {},
            "spec.template.spec.containers[worker].volumeMounts[data].mountPath",
        ),
        (
            {"spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}},
            {},
            "spec.template.spec.containers[worker].resources.limits[nvidia.com/gpu]",
        ),
        (
            {"spec": {"containers": [{"name": "worker", "resources": {"requests": {"cpu": "2"}}}]}},
            {"workerResources": {"cpu": "4"}},
            "spec.template.spec.containers[worker].resources.requests[cpu]: also set by spec.workerResources",
        ),
    ],
)
def test_clashes_with_the_rest_of_the_job_are_refused(
    template: dict[str, Any], spec: dict[str, Any], field: str
) -> None:
    problems = problems_of(template, **spec)
    assert len(problems) == 1 and problems[0].startswith(field), problems


TOKEN_VOLUME = {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}
GUARDED = [
    ({"hostNetwork": True}, "spec.template.spec.hostNetwork", "allowHostNamespaces"),
    ({"hostPID": True}, "spec.template.spec.hostPID", "allowHostNamespaces"),
    (
        {"containers": [{"name": "worker", "securityContext": {"privileged": True}}]},
        "spec.template.spec.containers[worker].securityContext.privileged",
        "allowPrivileged",
    ),
    (
        {
            "containers": [
                {"name": "s", "image": "s:1", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}
            ]
        },
        "spec.template.spec.containers[s].securityContext.capabilities.add",
        "allowAddedCapabilities",
    ),
    ({"serviceAccountName": "builder"}, "spec.template.spec.serviceAccountName", "allowServiceAccounts"),
    (
        {"automountServiceAccountToken": True},
        "spec.template.spec.automountServiceAccountToken",
        "allowServiceAccounts",
    ),
    ({"volumes": [TOKEN_VOLUME]}, "spec.template.spec.volumes[token]", "allowServiceAccounts"),
]


@pytest.mark.parametrize(("pod_spec", "field", "setting"), GUARDED)
def test_each_guard_refuses_by_default_and_its_setting_allows(
    pod_spec: dict[str, Any], field: str, setting: str
) -> None:
    (problem,) = problems_of({"spec": pod_spec})
    assert problem.startswith(f"{field}: ")
    assert f"operator.settings.launch.guards.{setting}=true" in problem
    snake = {
        "allowHostNamespaces": "allow_host_namespaces",
        "allowPrivileged": "allow_privileged",
        "allowAddedCapabilities": "allow_added_capabilities",
        "allowServiceAccounts": "allow_service_accounts",
    }[setting]
    allowed = launcher.LaunchOptions(guards=WorkerGuards(**{snake: True}))
    assert problems_of({"spec": pod_spec}, allowed) == []


def test_a_version_checked_once_answers_for_each_setting_it_was_checked_under() -> None:
    """The cycle checks every job each time: a job's version is checked again only under other
    settings (the operator's carry a mapping of classes), and an object rebuilt from it (an assumed
    status) is checked afresh."""
    facts = JobFacts.from_body(job_body(template={"spec": {"hostNetwork": True}}))
    allowed = launcher.LaunchSettings(guards=WorkerGuards(allow_host_namespaces=True), classes={"a": {}})
    for _ in range(2):
        assert [p.split(":")[0] for p in job_problems(facts)[1]] == ["spec.template.spec.hostNetwork"]
        assert job_problems(facts, allowed)[1] == []
    assert job_problems(facts, dataclasses.replace(allowed, classes={"a": {}}))[1] == []
    assert dataclasses.replace(facts, phase="Running").checked == []


def test_the_network_policy_lets_in_the_job_and_prometheus_only() -> None:
    model = job()
    settings = launcher.LaunchSettings(
        metrics_port=9400,
        network_policy=NetworkPolicyOptions(
            enabled=True, prometheus_namespace="monitoring", prometheus_pod_labels="app=prometheus,tier=core"
        ),
    )
    chosen = allocation(("node-a", "fast"))
    manifests = launcher.generation_manifests(model, chosen, None, settings)
    (policy,) = [m for m in manifests if m["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    job_pods = {"matchLabels": {"heterotrain.io/job": "train"}}
    assert policy["spec"] == {
        "podSelector": job_pods,
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": job_pods}]},
            {
                "from": [
                    {
                        "podSelector": {"matchLabels": {"app": "prometheus", "tier": "core"}},
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
                    }
                ],
                "ports": [{"protocol": "TCP", "port": 9400}],
            },
        ],
    }
    kubernetes_validate.validate(policy, "1.36", strict=True)
    assert not [
        m
        for m in launcher.generation_manifests(model, chosen, None, SETTINGS)
        if m["kind"] == "NetworkPolicy"
    ]


def test_prometheus_labels_that_are_not_pairs_are_refused() -> None:
    with pytest.raises(ValueError, match="is not key=value"):
        NetworkPolicyOptions(prometheus_pod_labels="app")
