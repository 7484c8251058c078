# ruff: noqa: E501  (the API server's metric lines, as it writes them)
"""The scale benchmark's reading of the API server's request counters."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"

METRICS = """# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 2250
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="heterotrain.io",resource="heterotrainjobs",scope="namespace",subresource="status",verb="PATCH",version="v1alpha1"} 731
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="pods",scope="cluster",subresource="",verb="WATCH",version="v1"} 4
# HELP apiserver_request_duration_seconds [STABLE] Response latency distribution.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{component="apiserver",resource="pods",verb="POST",le="0.005"} 2000
apiserver_request_duration_seconds_bucket{component="apiserver",resource="pods",verb="POST",le="+Inf"} 2253
apiserver_request_duration_seconds_sum{component="apiserver",resource="pods",verb="POST"} 9.5
apiserver_request_duration_seconds_count{component="apiserver",resource="pods",verb="POST"} 2253
"""


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH_DIR))
    try:
        spec = importlib.util.spec_from_file_location(
            "scheduler_scale_bench", BENCH_DIR / "scheduler_scale.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH_DIR))


def test_request_counts_sum_codes_name_subresources_and_leave_watches_out(bench: ModuleType) -> None:
    counts = bench.request_counts(METRICS)
    assert counts == {"POST pods": 2253, "PATCH heterotrainjobs/status": 731}


def test_percentiles_of_raw_durations_need_no_buckets(bench: ModuleType) -> None:
    durations = [0.1] * 98 + [0.9, 2.0]
    assert bench.percentile(durations, 0.5) == pytest.approx(0.1)
    assert bench.percentile(durations, 0.99) == pytest.approx(0.9 + 0.01 * (2.0 - 0.9))
    assert bench.percentile([0.3], 0.99) == 0.3


def test_the_operators_own_request_counter_is_read_by_verb_and_resource(bench: ModuleType) -> None:
    text = (
        "# TYPE heterotrain_operator_kube_requests counter\n"
        'heterotrain_operator_kube_requests_total{resource="pods",verb="POST"} 12.0\n'
        'heterotrain_operator_kube_requests_total{resource="heterotrainjobs/status",verb="PATCH"} 4.0\n'
    )
    assert bench.operator_requests(text) == {"POST pods": 12, "PATCH heterotrainjobs/status": 4}
