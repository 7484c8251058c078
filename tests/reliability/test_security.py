"""Security: restricted pods, least-privilege RBAC, an API that refuses strangers, and no secret in
what the operator writes.

One job runs to the end under an operator that has nothing but the chart's ServiceAccount (cluster-
wide RBAC mode) and logs at debug level; its worker env takes a value from a Secret. The tests then
check the live pods, the chart's RBAC and Deployment, the HTTP API, and scan the operator's log, the
Events and the job's status for the ServiceAccount token and the Secret's value.
"""

from __future__ import annotations

import base64
import json
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from tests.operator.conftest import gpu_classes_tolerating_kwok
from tests.operator.live import (
    ChartAccount,
    Jobs,
    OperatorProcess,
    account_kubeconfig,
    chart_service_account,
    wait_for,
)
from tests.ship.helm_chart import render

from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.processes import free_port

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

Record = Callable[..., None]
JOB = "guarded"
# Verbs with which an account could grant itself more than it holds.
ESCALATING_VERBS = {"escalate", "bind", "impersonate", "*"}


@dataclass(frozen=True)
class SecuredRun:
    testbed: Testbed
    namespace: str
    account: ChartAccount
    operator_token: str
    secret_value: str
    outsider_token: str
    api_url: str
    log: Path


def token_of(kubeconfig: Path) -> str:
    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


@pytest.fixture(scope="module")
def secured_run(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRun]:
    root = Path(tmp_path_factory.mktemp("security"))
    namespace = f"sec-{uuid.uuid4().hex[:8]}"
    secret_value = f"s3cret-{secrets.token_hex(16)}"
    testbed.apply_objects(gpu_classes_tolerating_kwok())
    testbed.kubectl("create", "namespace", namespace)
    testbed.kubectl(
        "create", "secret", "generic", "training-key", "-n", namespace, f"--from-literal=key={secret_value}"
    )
    # An account with no rights at all: the API must refuse it.
    testbed.kubectl("create", "serviceaccount", "outsider", "-n", namespace)
    outsider = testbed.kubectl("create", "token", "outsider", "-n", namespace, "--duration=1h").stdout.strip()
    port = free_port()
    with chart_service_account(testbed, root / "helm") as account:
        kubeconfig = account_kubeconfig(testbed, account, root / "operator.kubeconfig")
        operator = OperatorProcess(
            testbed,
            root / "operator.log",
            kubeconfig=kubeconfig,
            extra_args=("--api-port", str(port), "--verbose"),
        )
        operator.start()
        jobs = Jobs(testbed, namespace)
        try:
            env = [
                {
                    "name": "TRAINING_KEY",
                    "valueFrom": {"secretKeyRef": {"name": "training-key", "key": "key"}},
                }
            ]
            jobs.apply(jobs.manifest(JOB, gpus=2, env=env))
            jobs.wait_phase(JOB, "Running", timeout=90)
            jobs.finish(jobs.running_pods(JOB), 0)
            jobs.wait_phase(JOB, "Succeeded", timeout=60)
            yield SecuredRun(
                testbed,
                namespace,
                account,
                token_of(kubeconfig),
                secret_value,
                outsider,
                f"http://127.0.0.1:{port}",
                operator.log,
            )
        finally:
            jobs.delete_all(timeout=60)
            operator.stop()
            testbed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _violations(kind: str, pod_context: dict[str, Any], container: dict[str, Any]) -> list[str]:
    context = container.get("securityContext") or {}
    found = []
    if not (context.get("runAsNonRoot") or pod_context.get("runAsNonRoot")):
        found.append(f"{kind}: may run as root")
    if context.get("runAsUser", pod_context.get("runAsUser")) == 0:
        found.append(f"{kind}: runs as user 0")
    if context.get("readOnlyRootFilesystem") is not True:
        found.append(f"{kind}: writable root filesystem")
    if context.get("allowPrivilegeEscalation") is not False:
        found.append(f"{kind}: privilege escalation allowed")
    if context.get("privileged"):
        found.append(f"{kind}: privileged")
    if "ALL" not in ((context.get("capabilities") or {}).get("drop") or []):
        found.append(f"{kind}: capabilities not all dropped")
    if (context.get("capabilities") or {}).get("add"):
        found.append(f"{kind}: capabilities added")
    return found


def pod_spec_violations(name: str, spec: dict[str, Any]) -> list[str]:
    pod_context = spec.get("securityContext") or {}
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    assert containers, f"{name} has no containers"
    found = [v for c in containers for v in _violations(f"{name}/{c['name']}", pod_context, c)]
    if spec.get("hostNetwork") or spec.get("hostPID") or spec.get("hostIPC"):
        found.append(f"{name}: shares a host namespace")
    return found


def test_every_worker_pod_the_operator_created_is_restricted(secured_run: SecuredRun, record: Record) -> None:
    pods = json.loads(
        secured_run.testbed.kubectl("get", "pods", "-n", secured_run.namespace, "-o", "json").stdout
    )["items"]
    problems = []
    for pod in pods:
        problems += pod_spec_violations(pod["metadata"]["name"], pod["spec"])
        if pod["spec"].get("automountServiceAccountToken") is not False:
            problems.append(f"{pod['metadata']['name']}: mounts a ServiceAccount token")
    record(
        area="security",
        what="security context of every worker pod the operator created (live objects)",
        trials=len(pods),
        survived=len(pods) - len({p.split("/")[0].split(":")[0] for p in problems}),
        lost="nothing" if not problems else "; ".join(problems),
        checks="runAsNonRoot, readOnlyRootFilesystem, allowPrivilegeEscalation false, capabilities drop ALL, "
        "no host namespaces, no ServiceAccount token mounted",
    )
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    assert not problems, problems


def test_the_chart_operator_deployment_is_restricted(
    secured_run: SecuredRun, tmp_path: Path, record: Record
) -> None:
    rendered = {
        "one replica, cluster-wide": {},
        "two replicas, namespaced": {"replicaCount": 2, "watchNamespaces": ["team-a"]},
    }
    specs = {
        label: next(m for m in render(values, tmp_path / "helm") if m["kind"] == "Deployment")["spec"][
            "template"
        ]["spec"]
        for label, values in rendered.items()
    }
    live = json.loads(
        secured_run.testbed.kubectl(
            "get", "deployment", "-n", secured_run.account.namespace, "-o", "json"
        ).stdout
    )["items"]
    assert len(live) == 1, "the installed chart's Deployment"
    specs["installed (live object)"] = live[0]["spec"]["template"]["spec"]
    problems = [v for label, spec in specs.items() for v in pod_spec_violations(label, spec)]
    record(
        area="security",
        what="the chart's operator Deployment: " + ", ".join(specs),
        trials=len(specs),
        survived=len(specs) - len({p.split("/")[0] for p in problems}),
        lost="nothing" if not problems else "; ".join(problems),
        checks="runAsNonRoot, readOnlyRootFilesystem, allowPrivilegeEscalation false, capabilities drop ALL",
        ran_on="test bed (the installed Deployment) and `helm template` output (the other modes)",
    )
    assert not problems, problems


def _rules(testbed: Testbed, kind: str, name: str, namespace: str | None = None) -> list[dict[str, Any]]:
    where = ["-n", namespace] if namespace else []
    return list(json.loads(testbed.kubectl("get", kind, name, *where, "-o", "json").stdout)["rules"])


def cluster_scoped_resources(testbed: Testbed) -> set[tuple[str, str]]:
    """(group, resource) of every cluster-scoped resource the API server serves, subresources too."""
    out = testbed.kubectl("api-resources", "--namespaced=false", "-o", "name").stdout.split()
    scoped = set()
    for name in out:
        resource, _, group = name.partition(".")
        scoped.add((group, resource))
    return scoped


def test_rbac_is_least_privilege(secured_run: SecuredRun, tmp_path: Path, record: Record) -> None:
    testbed = secured_run.testbed
    problems: list[str] = []
    cluster_scoped = cluster_scoped_resources(testbed)
    # Namespaced mode: the ClusterRole may only hold what a Role cannot (cluster-scoped objects, reviews).
    namespaced = render({"watchNamespaces": ["team-a"]}, tmp_path / "helm")
    cluster_role = next(m for m in namespaced if m["kind"] == "ClusterRole")
    for rule in cluster_role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                if (group, resource.split("/")[0]) not in cluster_scoped:
                    problems.append(
                        f"namespaced mode: ClusterRole grants {group}/{resource}, which a Role could"
                    )
    # Every role of both modes, live and rendered: no wildcards, no Secrets, no verbs that escalate.
    roles = {
        "live ClusterRole (cluster-wide)": _rules(testbed, "clusterrole", secured_run.account.cluster_role),
        **{
            f"rendered {m['kind']} {m['metadata'].get('namespace', '')}": m["rules"]
            for m in namespaced
            if m["kind"] in ("ClusterRole", "Role")
        },
    }
    for label, rules in roles.items():
        for rule in rules:
            resources, verbs = set(rule.get("resources", [])), set(rule.get("verbs", []))
            if "*" in resources or "*" in set(rule.get("apiGroups", [])):
                problems.append(f"{label}: wildcard in {rule}")
            if verbs & ESCALATING_VERBS:
                problems.append(f"{label}: escalating verbs {sorted(verbs & ESCALATING_VERBS)}")
            if resources & {"secrets", "serviceaccounts/token", "roles", "clusterroles", "rolebindings"}:
                problems.append(f"{label}: grants {sorted(resources)}")
    # What the API server itself answers for the account.
    subject = f"system:serviceaccount:{secured_run.account.namespace}:{secured_run.account.name}"
    denied = [
        ("get", "secrets", secured_run.namespace),
        ("list", "secrets", "kube-system"),
        ("create", "clusterrolebindings", ""),
        ("delete", "nodes", ""),
        ("create", "serviceaccounts/token", secured_run.namespace),
    ]
    for verb, resource, namespace in denied:
        where = ["-n", namespace] if namespace else []
        answer = testbed.kubectl(
            "auth", "can-i", verb, resource, *where, "--as", subject, check=False
        ).stdout.strip()
        if answer != "no":
            problems.append(f"the account can {verb} {resource} ({answer})")
    checked = len(roles) + len(denied) + 1
    record(
        area="security",
        what="the chart's RBAC: namespaced and cluster-wide modes, rendered and live; `kubectl auth can-i` "
        "as the operator's ServiceAccount",
        trials=checked,
        survived=checked - len(problems),
        lost="nothing" if not problems else "; ".join(problems),
        checks="ClusterRole of namespaced mode holds only cluster-scoped resources; no wildcard, no Secrets, "
        "no RBAC objects, no escalate/bind/impersonate; the account cannot read Secrets, bind roles, "
        "delete nodes or mint tokens",
        ran_on="test bed (installed roles, `kubectl auth can-i`) and `helm template` output",
    )
    assert not problems, problems


def test_the_http_api_refuses_strangers(secured_run: SecuredRun, record: Record) -> None:
    base = secured_run.api_url
    wait_for(lambda: _status(f"{base}/healthz") == 200, 30, "the operator's API")
    jobs = f"{base}/api/v1/jobs?namespace={secured_run.namespace}"
    job = f"{base}/api/v1/jobs/{secured_run.namespace}/{JOB}"
    cases = {
        "no token, jobs": (_status(jobs), 401),
        "no token, one job": (_status(job), 401),
        "no token, pools": (_status(f"{base}/api/v1/pools"), 401),
        "no token, what-if": (_status(f"{base}/api/v1/whatif", method="POST"), 401),
        "forged token": (_status(jobs, "forged-" + secrets.token_hex(8)), 401),
        "malformed header": (_status(jobs, header="Basic Zm9vOmJhcg=="), 401),
        "account without rights, jobs": (_status(jobs, secured_run.outsider_token), 403),
        "account without rights, one job": (_status(job, secured_run.outsider_token), 403),
    }
    wrong = {name: got for name, (got, want) in cases.items() if got != want}
    record(
        area="security",
        what="HTTP API requests without a token, with a forged or malformed one, and from an account "
        "without rights (operator under the chart's ServiceAccount)",
        trials=len(cases),
        survived=len(cases) - len(wrong),
        lost="nothing" if not wrong else f"answered {wrong}",
        checks="401 for every unauthenticated request, 403 for an authenticated account without access "
        "(TokenReview and SubjectAccessReview on the live API server)",
    )
    assert not wrong, wrong


WHATIF_BODY = {
    "spec": {"image": "heterotrain/trainer:test", "gpus": {"min": 1, "max": 1}, "batch": {"global": 64}}
}


def _status(url: str, token: str | None = None, header: str | None = None, method: str = "GET") -> int:
    headers = {"Authorization": header or f"Bearer {token}"} if (token or header) else {}
    body = WHATIF_BODY if method == "POST" else None
    try:
        return httpx.request(method, url, headers=headers, json=body, timeout=30).status_code
    except httpx.HTTPError:
        return 0


def test_no_token_or_secret_in_logs_events_or_status(secured_run: SecuredRun, record: Record) -> None:
    testbed = secured_run.testbed
    # Requests that carry tokens: they are in the API's hands now, and must not come out anywhere.
    _status(f"{secured_run.api_url}/api/v1/jobs", secured_run.outsider_token)
    _status(f"{secured_run.api_url}/api/v1/jobs", secured_run.operator_token)
    sources = {
        "operator log": secured_run.log.read_text(errors="replace"),
        "Events": testbed.kubectl("get", "events", "-n", secured_run.namespace, "-o", "json").stdout,
        "job status": json.dumps(Jobs(testbed, secured_run.namespace).status(JOB)),
        "worker pods (only the reference)": testbed.kubectl(
            "get", "pods", "-n", secured_run.namespace, "-o", "json"
        ).stdout,
    }
    assert "DEBUG" in sources["operator log"] and len(sources["operator log"]) > 1000, "the log is a real one"
    needles = {
        "ServiceAccount token": secured_run.operator_token,
        "outsider token": secured_run.outsider_token,
        "Secret value": secured_run.secret_value,
        "Secret value (base64)": _b64(secured_run.secret_value),
    }
    leaks = [
        f"{needle} in {where}"
        for where, text in sources.items()
        for needle, value in needles.items()
        if value in text
    ]
    trials = len(sources) * len(needles)
    record(
        area="security",
        what="scan of the operator's debug log, Events, job status and worker pods for the ServiceAccount "
        "token, API callers' tokens and a Secret the job's env refers to",
        trials=trials,
        survived=trials - len(leaks),
        lost="nothing" if not leaks else "; ".join(leaks),
        checks="none of the tokens or the Secret's value (plain or base64) appears anywhere",
    )
    assert not leaks, leaks


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_the_api_client_sends_the_token_of_a_kubeconfig_or_service_account() -> None:
    """The kubernetes client keeps bearer tokens under "BearerToken"; the API must send them (it once
    read only "authorization" and asked the API server anonymously)."""
    from kubernetes.client import Configuration

    from hetero_operator.api.kube import KubeConnection

    for key in ("BearerToken", "authorization"):
        configuration = Configuration(host="https://127.0.0.1:6443")
        configuration.api_key = {key: "Bearer abc"}
        assert KubeConnection.from_configuration(configuration).authorization() == "Bearer abc"
