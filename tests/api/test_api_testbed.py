"""The HTTP API over real HTTP on the test bed, with real service-account tokens and RBAC."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import socket
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from api_bed import QUEUED_MESSAGE, ApiBed, serving
from api_cases import job_spec, two_class_pool
from prometheus_client import CollectorRegistry, Counter
from tests.operator.builders import profile

from hetero_operator.api import ApiSettings, ApiStartError, create_app, serve
from hetero_operator.api.health import OperatorChecks
from hetero_operator.api.kube import KubeConnection
from hetero_operator.controller.catalog import observe

pytestmark = pytest.mark.testbed


def _get(url: str, token: str | None = None, **params: str) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.get(url, headers=headers, params=params, timeout=30)


def _post(url: str, body: dict[str, Any], token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.post(url, json=body, headers=headers, timeout=60)


def test_probes_and_metrics_need_no_token(api_url: str) -> None:
    assert _get(f"{api_url}/healthz").json() == {"status": "ok", "checks": {"eventLoop": "ok"}}
    ready = _get(f"{api_url}/readyz")
    assert ready.status_code == 200 and ready.json() == {"ready": True, "checks": {"kubernetes": "ok"}}
    _get(f"{api_url}/api/v1/pools")  # one refused request, to be counted
    metrics = _get(f"{api_url}/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'heterotrain_api_requests_total{code="401",method="GET",route="/api/v1/pools"}' in metrics.text


@pytest.mark.parametrize(
    "path", ["/api/v1/pools", "/api/v1/jobs", "/api/v1/jobs/default/anything"], ids=["pools", "jobs", "job"]
)
def test_anonymous_and_forged_tokens_get_401(api_url: str, path: str) -> None:
    anonymous = _get(api_url + path)
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert "kubectl create token" in anonymous.json()["detail"]
    forged = _get(api_url + path, "not-a-real-token")
    assert forged.status_code == 401 and "did not accept" in forged.json()["detail"]


def test_whatif_without_a_token_gets_401(api_url: str) -> None:
    response = _post(f"{api_url}/api/v1/whatif", {"spec": job_spec(1)})
    assert response.status_code == 401


def test_reader_lists_the_jobs_of_its_namespace(api_bed: ApiBed, api_url: str) -> None:
    response = _get(f"{api_url}/api/v1/jobs", api_bed.reader_token, namespace=api_bed.namespace)
    assert response.status_code == 200, response.text
    items = {item["name"]: item for item in response.json()["items"]}
    assert set(items) == {"train-queued", "train-running"}
    running, queued = items["train-running"], items["train-queued"]
    assert (running["phase"], running["gpus"], running["classes"]) == ("Running", 4, f"{api_bed.fast}:4")
    assert (running["epoch"], running["epochs"], running["samplesPerSecond"], running["restarts"]) == (
        1,
        3,
        512.0,
        1,
    )
    assert (queued["phase"], queued["gpus"], queued["message"]) == ("Queued", 0, QUEUED_MESSAGE)


def test_reader_sees_allocation_plan_and_history_of_one_job(api_bed: ApiBed, api_url: str) -> None:
    response = _get(f"{api_url}/api/v1/jobs/{api_bed.namespace}/train-running", api_bed.reader_token)
    assert response.status_code == 200, response.text
    job = response.json()
    assert [w["node"] for w in job["allocation"]["workers"]] == [api_bed.node("fast-0")] * 4
    assert job["plan"]["localBatches"] == [32, 32, 32, 32] and job["plan"]["version"] == 2
    assert job["progress"] == {"epoch": 1, "samplesPerSecond": 512.0, "etaSeconds": 40.0, "updatedAt": None}
    assert [(r["fromVersion"], r["toVersion"], r["reason"]) for r in job["rebalances"]] == [
        (1, 2, "MeasuredSpeeds")
    ]
    assert [c["type"] for c in job["conditions"]] == ["Placed"]
    assert (job["gpusMin"], job["gpusMax"], job["gpuClasses"]) == (4, 4, [api_bed.fast, api_bed.slow])
    missing = _get(f"{api_url}/api/v1/jobs/{api_bed.namespace}/no-such-job", api_bed.reader_token)
    assert missing.status_code == 404 and "no-such-job" in missing.json()["detail"]


def test_reader_is_denied_outside_its_rights(api_bed: ApiBed, api_url: str) -> None:
    other = _get(f"{api_url}/api/v1/jobs", api_bed.reader_token, namespace="default")
    assert other.status_code == 403
    detail = other.json()["detail"]
    assert f"system:serviceaccount:{api_bed.namespace}:reader" in detail and "'default'" in detail
    everywhere = _get(f"{api_url}/api/v1/jobs", api_bed.reader_token)
    assert everywhere.status_code == 403 and "cluster-wide" in everywhere.json()["detail"]


def test_outsider_is_denied_everything(api_bed: ApiBed, api_url: str) -> None:
    token = api_bed.outsider_token
    assert _get(f"{api_url}/api/v1/jobs", token, namespace=api_bed.namespace).status_code == 403
    assert _get(f"{api_url}/api/v1/jobs/{api_bed.namespace}/train-running", token).status_code == 403
    assert _get(f"{api_url}/api/v1/pools", token).status_code == 403
    body = {"namespace": api_bed.namespace, "spec": job_spec(1), "pool": two_class_pool()}
    assert _post(f"{api_url}/api/v1/whatif", body, token).status_code == 403


def test_pools_count_what_the_running_job_holds(api_bed: ApiBed, api_url: str) -> None:
    response = _get(f"{api_url}/api/v1/pools", api_bed.reader_token)
    assert response.status_code == 200, response.text
    pools = {p["gpuClass"]: p for p in response.json()["pools"]}
    fast, slow = pools[api_bed.fast], pools[api_bed.slow]
    assert (fast["gpusTotal"], fast["gpusAllocated"], fast["gpusFree"]) == (4, 4, 0)
    assert (slow["gpusTotal"], slow["gpusAllocated"], slow["gpusFree"]) == (4, 0, 4)
    assert [(n["name"], n["schedulable"]) for n in slow["nodes"]] == [(api_bed.node("slow-0"), True)]
    assert fast["relativeSpeed"] == 1.0 and slow["memoryGiB"] == 16


def test_workloads_list_the_throughput_catalog(api_bed: ApiBed, api_url: str) -> None:
    """A WorkloadProfile as the operator writes it (one job measured 1 and 2 ms per sample on the fast
    and slow classes): listed as 1000 and 500 samples/s, to callers who may list WorkloadProfiles."""
    key = f"{api_bed.prefix}-digits"
    measured = profile({api_bed.fast: 1.0, api_bed.slow: 2.0})
    status = observe(None, f"{api_bed.namespace}/earlier", measured, datetime(2026, 11, 28, tzinfo=UTC))
    api_bed.testbed.apply_objects(
        [
            {
                "apiVersion": "heterotrain.io/v1alpha1",
                "kind": "WorkloadProfile",
                "metadata": {"name": key},
                "spec": {"workload": key},
            }
        ]
    )
    patch = json.dumps({"status": status.to_wire()})
    api_bed.testbed.kubectl(
        "patch", "workloadprofile", key, "--subresource=status", "--type=merge", "-p", patch
    )
    try:
        response = _get(f"{api_url}/api/v1/workloads", api_bed.reader_token)
        assert response.status_code == 200, response.text
        item = next(i for i in response.json()["items"] if i["workload"] == key)
        assert {t["gpuClass"]: t["samplesPerSecond"] for t in item["throughput"]} == {
            api_bed.fast: 1000.0,
            api_bed.slow: 500.0,
        }
        assert item["jobs"] == 1
        assert _get(f"{api_url}/api/v1/workloads", api_bed.outsider_token).status_code == 403
    finally:
        api_bed.testbed.kubectl("delete", "workloadprofile", key, "--wait=false", check=False)


def test_whatif_against_the_live_pool_waits_behind_the_queue(api_bed: ApiBed, api_url: str) -> None:
    """The queued job arrived first and takes the free slow GPUs; the running job holds the fast ones."""
    body = {"namespace": api_bed.namespace, "spec": job_spec(2, 2, [api_bed.fast, api_bed.slow])}
    response = _post(f"{api_url}/api/v1/whatif", body, api_bed.reader_token)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["pool"] == "live" and not result["schedulable"]
    reasons = {r["gpuClass"]: r["reason"] for r in result["classReasons"]}
    assert reasons[api_bed.fast].startswith("0 of 2 GPUs free")
    assert reasons[api_bed.slow].startswith("0 of 2 GPUs free")


def test_whatif_at_high_priority_goes_first_and_may_preempt(api_bed: ApiBed, api_url: str) -> None:
    small = job_spec(2, 2, [api_bed.fast, api_bed.slow], priority=500)
    placed = _post(
        f"{api_url}/api/v1/whatif", {"namespace": api_bed.namespace, "spec": small}, api_bed.reader_token
    )
    result = placed.json()
    assert result["schedulable"] and result["allocation"]["classes"] == f"{api_bed.slow}:2"
    assert result["predictedSamplesPerSecond"] > 0 and sum(result["plan"]["localBatches"]) == 128
    big = job_spec(8, 8, [api_bed.fast, api_bed.slow], priority=500)
    waits = _post(
        f"{api_url}/api/v1/whatif", {"namespace": api_bed.namespace, "spec": big}, api_bed.reader_token
    )
    assert waits.json()["wouldPreempt"] == [f"{api_bed.namespace}/train-running"]


def test_whatif_against_a_given_pool_and_its_validation(api_bed: ApiBed, api_url: str) -> None:
    body = {
        "namespace": api_bed.namespace,
        "spec": job_spec(6, 8, ["fast", "slow"]),
        "pool": two_class_pool(),
    }
    result = _post(f"{api_url}/api/v1/whatif", body, api_bed.reader_token).json()
    assert result["pool"] == "request" and result["schedulable"]
    assert result["allocation"]["totalGpus"] == 8 and result["allocation"]["classes"] == "fast:4,slow:4"
    bad = {**body, "pool": {**two_class_pool(), "nodes": [{"name": "n", "gpuClass": "gone", "gpus": 1}]}}
    refused = _post(f"{api_url}/api/v1/whatif", bad, api_bed.reader_token)
    assert refused.status_code == 422 and "gone" in refused.text


def test_nothing_is_created_by_a_whatif(api_bed: ApiBed, api_url: str) -> None:
    before = api_bed.testbed.kubectl(
        "get", "htj,pods,configmaps", "-n", api_bed.namespace, "-o", "name"
    ).stdout
    body = {
        "namespace": api_bed.namespace,
        "name": "probe",
        "spec": job_spec(1, 1, [api_bed.slow], priority=900),
    }
    assert _post(f"{api_url}/api/v1/whatif", body, api_bed.reader_token).json()["schedulable"]
    after = api_bed.testbed.kubectl(
        "get", "htj,pods,configmaps", "-n", api_bed.namespace, "-o", "name"
    ).stdout
    assert after == before


def test_tokens_never_reach_the_logs(api_bed: ApiBed, api_url: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    token = api_bed.reader_token
    _get(f"{api_url}/api/v1/jobs", token, namespace=api_bed.namespace)
    _get(f"{api_url}/api/v1/jobs", token, namespace="default")
    _get(f"{api_url}/api/v1/pools", "forged-token-value")
    assert caplog.records, "the requests were logged at some level"
    assert token not in caplog.text and "forged-token-value" not in caplog.text


def _ended_task() -> asyncio.Task[None]:
    """A task that has ended with an error, as a crashed scheduling loop would."""

    async def crash() -> None:
        raise RuntimeError("the scheduling loop crashed")

    loop = asyncio.new_event_loop()
    try:
        task = loop.create_task(crash())
        loop.run_until_complete(asyncio.wait([task]))
    finally:
        loop.close()
    return task


def test_probes_follow_the_host_and_metrics_share_its_registry(api_bed: ApiBed) -> None:
    registry = CollectorRegistry()
    Counter("host_operator_cycles", "A metric the host process owns.", registry=registry).inc(3)
    cycles = [0]
    tasks: dict[str, asyncio.Task[None] | None] = {}
    host = OperatorChecks(cycles=lambda: cycles[0], tasks=lambda: tasks)
    settings = ApiSettings(kubeconfig=api_bed.testbed.kubeconfig, registry=registry, host=host)
    with serving(create_app(settings)) as url:
        ready = _get(f"{url}/readyz")
        assert ready.status_code == 503
        waiting = "waiting for the kopf indexes to sync (no scheduling cycle yet)"
        assert ready.json() == {"ready": False, "checks": {"kubernetes": "ok", "inventory": waiting}}
        cycles[0] = 1
        synced = {"kubernetes": "ok", "inventory": "ok"}
        assert _get(f"{url}/readyz").json() == {"ready": True, "checks": synced}
        tasks["schedulingLoop"] = _ended_task()
        alive = _get(f"{url}/healthz")
        assert alive.status_code == 503
        failing = {"eventLoop": "ok", "schedulingLoop": "ended: RuntimeError('the scheduling loop crashed')"}
        assert alive.json() == {"status": "failing", "checks": failing}
        assert "host_operator_cycles_total 3.0" in _get(f"{url}/metrics").text


def test_readyz_names_an_unreachable_api_server(api_bed: ApiBed) -> None:
    """A real connection refused: the API server's address with a port nothing listens on."""
    connection = KubeConnection.discover(api_bed.testbed.kubeconfig, None)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gone = dataclasses.replace(connection, server=f"https://127.0.0.1:{port}")
    with serving(create_app(ApiSettings(connection=gone))) as url:
        ready = _get(f"{url}/readyz")
        assert ready.status_code == 503
        body = ready.json()
        assert body["ready"] is False and body["checks"]["kubernetes"] != "ok"
        assert _get(f"{url}/healthz").status_code == 200, "an unreachable API server is no reason to restart"


def test_serve_reports_a_port_it_cannot_take(api_bed: ApiBed) -> None:
    app = create_app(ApiSettings(kubeconfig=api_bed.testbed.kubeconfig))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ApiStartError, match=f"127.0.0.1:{port}"):
            asyncio.run(serve(app, "127.0.0.1", port))
