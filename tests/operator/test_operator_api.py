"""The operator serves its HTTP API in-process when given --api-port."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from tests.operator.live import OperatorProcess, wait_for

from hetero_operator import metric_names
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.processes import free_port

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(120)]


def test_operator_serves_the_api(testbed: Testbed, tmp_path: Path) -> None:
    port = free_port()
    operator = OperatorProcess(testbed, tmp_path / "operator.log", extra_args=("--api-port", str(port)))
    operator.start()
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                return httpx.get(f"{base}/healthz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, timeout=60, what="the API's /healthz")
        assert httpx.get(f"{base}/api/v1/jobs", timeout=5).status_code == 401, "no token, no answer"
        metrics = httpx.get(f"{base}/metrics", timeout=5).text
        assert metric_names.OPERATOR_JOBS in metrics, "the API serves the operator's own metrics"
    finally:
        operator.stop()
