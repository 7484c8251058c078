"""Plan sources (file, ConfigMap over HTTP, URL) and the pure apply/defer/ignore/refuse decision."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan, Strategy
from hetero_runtime.plan_client import (
    ConfigMapPlanSource,
    FilePlanSource,
    PlanSourceError,
    PlanTracker,
    UrlPlanSource,
    judge_plan_text,
    plan_source_from_spec,
)


def plan(version: int, batches: list[int], epoch: int = 0, **extra: object) -> Plan:
    return Plan(
        version=version,
        apply_at_epoch=epoch,
        world_size=len(batches),
        global_batch=sum(batches),
        local_batches=batches,
        **extra,
    )


def test_decisions() -> None:
    current = plan(2, [4, 2, 1])
    assert judge_plan_text(plan(3, [3, 3, 1]).to_json(), current, 3, 5).action == "apply"
    deferred = judge_plan_text(plan(3, [3, 3, 1], epoch=7).to_json(), current, 3, 5)
    assert deferred.action == "defer" and "epoch 7" in deferred.reason
    assert judge_plan_text(plan(2, [3, 3, 1]).to_json(), current, 3, 5).action == "ignore"
    misfit = judge_plan_text(plan(3, [4, 3]).to_json(), current, 3, 5)
    assert misfit.action == "refuse" and "world_size 2" in misfit.reason
    broken = judge_plan_text('{"version": 3, "world_size": 3}', current, 3, 5)
    assert broken.action == "refuse" and "global_batch" in broken.reason
    assert judge_plan_text("not json", current, 3, 5).action == "refuse"
    switch = judge_plan_text(plan(3, [4, 2, 1], strategy=Strategy.ESYNC).to_json(), current, 3, 5)
    assert switch.action == "refuse" and "restart" in switch.reason


def test_tracker_defers_then_applies_and_keeps_old_plan_on_refusal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(plan(1, [4, 2, 1]).to_json())
    tracker = PlanTracker(FilePlanSource(path), world_size=3)
    assert tracker.plan_for_epoch(0).version == 1
    path.write_text(plan(2, [3, 3, 1], epoch=2).to_json())
    assert tracker.plan_for_epoch(1).version == 1
    assert tracker.plan_for_epoch(2).version == 2
    path.write_text('{"version": 9, "world_size": 3, "global_batch": 5, "local_batches": [1, 1, 1]}')
    with caplog.at_level(logging.ERROR):
        assert tracker.plan_for_epoch(3).version == 2
    assert "malformed plan" in caplog.text and "keeping plan version 2" in caplog.text
    path.unlink()
    assert tracker.plan_for_epoch(4).version == 2  # the source vanished: keep going


class _Handler(BaseHTTPRequestHandler):
    body = b""
    seen_auth: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.seen_auth.append(self.headers.get("Authorization", ""))
        if self.path == "/missing":
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[tuple[str, type[_Handler]]]:
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Handler
    finally:
        server.shutdown()
        server.server_close()


def test_configmap_source_reads_the_plan_key_with_the_token(http_server: tuple[str, type[_Handler]]) -> None:
    url, handler = http_server
    expected = plan(4, [2, 2])
    handler.body = json.dumps(
        {"kind": "ConfigMap", "data": {PLAN_CONFIGMAP_KEY: expected.to_json()}}
    ).encode()
    source = ConfigMapPlanSource("team-a", "job-plan", url, token="secret", verify=False)
    assert Plan.from_json(source.read()) == expected
    assert handler.seen_auth[-1] == "Bearer secret"
    handler.body = json.dumps({"data": {}}).encode()
    with pytest.raises(PlanSourceError, match="no key"):
        source.read()


def test_url_source_and_errors(http_server: tuple[str, type[_Handler]]) -> None:
    url, handler = http_server
    handler.body = plan(5, [1]).to_json().encode()
    assert Plan.from_json(UrlPlanSource(url + "/plan").read()).version == 5
    with pytest.raises(PlanSourceError):
        UrlPlanSource(url + "/missing").read()


def test_source_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(plan_source_from_spec(str(tmp_path / "p.json")), FilePlanSource)
    assert isinstance(plan_source_from_spec("file:///etc/plan.json"), FilePlanSource)
    assert isinstance(plan_source_from_spec("https://example.invalid/plan"), UrlPlanSource)
    monkeypatch.setenv("HETEROTRAIN_KUBE_API_URL", "http://127.0.0.1:1")
    source = plan_source_from_spec("configmap://ns/name")
    assert isinstance(source, ConfigMapPlanSource) and (source.namespace, source.name) == ("ns", "name")
    with pytest.raises(ValueError, match="configmap://NAMESPACE/NAME"):
        plan_source_from_spec("configmap://ns")
    with pytest.raises(ValueError, match="unknown scheme"):
        plan_source_from_spec("s3://bucket/plan")
