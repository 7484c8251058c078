"""Guards and the per-job NetworkPolicy on the live test bed. The operator runs as the chart's
ServiceAccount, installed with `operator.settings.launch.networkPolicy.enabled` (the chart then grants
NetworkPolicies) and the default guards (a template may ask for nothing beyond a restricted pod)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import (
    ChartAccount,
    Jobs,
    OperatorProcess,
    chart_operator,
    chart_service_account,
    wait_for,
)

from hetero_operator import metric_names
from hetero_operator.controller import names
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(180)]

NETWORK_POLICY_VALUES = {"operator": {"settings": {"launch": {"networkPolicy": {"enabled": True}}}}}


@pytest.fixture(scope="module")
def policy_account(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartAccount]:
    with chart_service_account(
        testbed, tmp_path_factory.mktemp("helm-network-policy"), NETWORK_POLICY_VALUES
    ) as account:
        yield account


@pytest.fixture(scope="module")
def operator(
    testbed: Testbed,
    gpu_classes: None,
    policy_account: ChartAccount,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    directory = Path(tmp_path_factory.mktemp("operator-guards"))
    with chart_operator(
        testbed, policy_account, directory, extra_args=("--launch.network-policy.enabled",)
    ) as process:
        yield process


def refused(jobs: Jobs, name: str) -> dict[str, Any] | None:
    valid = jobs.condition(name, "Valid")
    return valid if valid is not None and valid["status"] == "False" else None


@pytest.mark.parametrize(
    ("template", "field", "chart_value"),
    [
        ({"spec": {"hostNetwork": True}}, "spec.template.spec.hostNetwork", "allowHostNamespaces"),
        (
            {"spec": {"containers": [{"name": "worker", "securityContext": {"privileged": True}}]}},
            "privileged",
            "allowPrivileged",
        ),
        ({"spec": {"serviceAccountName": "builder"}}, "serviceAccountName", "allowServiceAccounts"),
    ],
    ids=["host-network", "privileged", "service-account"],
)
def test_a_template_asking_for_more_is_refused_naming_the_field_and_the_chart_value(
    operator: OperatorProcess, jobs: Jobs, template: dict[str, Any], field: str, chart_value: str
) -> None:
    jobs.apply(jobs.manifest("asks", gpus=1, template=template))
    valid = wait_for(lambda: refused(jobs, "asks"), 30, "the guard to refuse the job")
    assert field in valid["message"] and chart_value in valid["message"], valid["message"]
    assert jobs.phase("asks") != "Running" and not jobs.pods("asks"), "nothing is created for it"


def test_each_job_gets_a_network_policy_it_owns(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("fenced", gpus=2))
    jobs.wait_phase("fenced", "Running")
    uid = jobs.get("fenced")["metadata"]["uid"]
    policies = json.loads(jobs.kubectl("get", "networkpolicies", "-o", "json"))["items"]
    assert len(policies) == 1, [p["metadata"]["name"] for p in policies]
    policy = policies[0]
    assert [o["uid"] for o in policy["metadata"]["ownerReferences"]] == [uid]
    own_workers = {"matchLabels": {names.LABEL_JOB: "fenced"}}
    assert policy["spec"]["podSelector"] == own_workers
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    rules = policy["spec"]["ingress"]
    # The job's own workers on any port; Prometheus on the metrics port only; nothing else.
    assert {"from": [{"podSelector": own_workers}]} in rules
    others = [r for r in rules if r != {"from": [{"podSelector": own_workers}]}]
    assert len(others) == 1 and [p["port"] for p in others[0]["ports"]] == [metric_names.DEFAULT_METRICS_PORT]
    prometheus = others[0]["from"][0]
    assert prometheus["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert prometheus["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    # The workers' pods carry the label the policy selects.
    assert all(p["metadata"]["labels"][names.LABEL_JOB] == "fenced" for p in jobs.pods("fenced"))
