"""The Grafana dashboards: generated from the metric names, checked in, and valid for the SDK."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from grafana_foundation_sdk.models import dashboard as sdk_dashboard
from grafana_foundation_sdk.models import prometheus as sdk_prometheus
from hypothesis import given, settings
from hypothesis import strategies as st
from promql_metrics import exported_series, series_read_by

from hetero_operator import metric_names
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.dashboards import DASHBOARDS, panel_queries, runnable_query
from hetero_operator.dashboards.export import canonical, panels_of, stale_files
from hetero_operator.dashboards.generate import main as dashboards_main
from hetero_runtime.metrics import WorkerMetrics

REPO_ROOT = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO_ROOT / "helm" / "heterotrain" / "dashboards"
VARIABLES = {"job": "digits", "datasource": "prometheus"}


def checked_in() -> dict[str, dict[str, Any]]:
    return {name: json.loads((CHECKED_IN / name).read_text()) for name in DASHBOARDS}


def test_checked_in_json_equals_the_generator_output() -> None:
    assert stale_files(CHECKED_IN) == [], "run: python -m hetero_operator.dashboards"


def test_generator_cli_writes_and_checks(tmp_path: Path) -> None:
    assert dashboards_main(["--out", str(tmp_path), "--check"]) == 1
    assert dashboards_main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(DASHBOARDS)
    assert dashboards_main(["--out", str(tmp_path), "--check"]) == 0
    (tmp_path / "gpu-pools.json").write_text("{}")
    assert dashboards_main(["--out", str(tmp_path), "--check"]) == 1


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_json_round_trips_exactly_through_the_sdk_types(name: str) -> None:
    board = checked_in()[name]
    assert canonical(board) == board
    model = sdk_dashboard.Dashboard.from_json(board)
    assert model.title and model.uid
    panels = [p for p in model.panels or [] if isinstance(p, sdk_dashboard.Panel)]
    assert panels
    for panel in panels:
        assert all(isinstance(t, sdk_prometheus.Dataquery) for t in panel.targets or [])


def test_dashboard_identities_are_unique() -> None:
    boards = checked_in().values()
    assert len({b["uid"] for b in boards}) == len(DASHBOARDS)
    for board in boards:
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_has_a_promql_target(name: str) -> None:
    panels = list(panels_of(checked_in()[name]))
    assert len(panels) >= 5
    for panel in panels:
        exprs = [t.get("expr") for t in panel.get("targets") or []]
        assert exprs and all(exprs), f"panel {panel['title']!r} has no PromQL"
        assert panel["datasource"]["type"] == "prometheus"


def test_every_series_in_the_promql_is_exported_under_a_metric_name_constant() -> None:
    exported = {
        **exported_series(OperatorMetrics().registry),
        **exported_series(WorkerMetrics("job", 0, "class").registry),
    }
    constants = {value for value in vars(metric_names).values() if isinstance(value, str)}
    read = set()
    for board in checked_in().values():
        for expr in panel_queries(board):
            read |= series_read_by(runnable_query(expr, VARIABLES))
    assert read, "no series found in the queries"
    unknown = read - exported.keys()
    assert not unknown, f"queries read series nobody exports: {sorted(unknown)}"
    assert {exported[series] for series in read} <= constants


def test_the_dashboards_cover_the_metrics_users_look_at() -> None:
    boards = checked_in()
    pools = " ".join(panel_queries(boards["gpu-pools.json"]))
    job = " ".join(panel_queries(boards["training-job.json"]))
    for metric in (
        metric_names.OPERATOR_GPUS_ALLOCATED,
        metric_names.OPERATOR_QUEUE_LENGTH,
        metric_names.OPERATOR_PLACEMENT_SECONDS,
        metric_names.OPERATOR_CYCLE_SECONDS,
    ):
        assert metric in pools
    for metric in (
        metric_names.LOCAL_BATCH,
        metric_names.SAMPLES,
        metric_names.STEP_SECONDS,
        metric_names.EPOCH,
        metric_names.LOSS,
        metric_names.PLAN_VERSION,
    ):
        assert metric in job


def test_panel_queries_reads_panels_nested_in_collapsed_rows() -> None:
    board = {
        "panels": [
            {"type": "row", "panels": [{"type": "timeseries", "targets": [{"expr": "a"}, {"expr": "b"}]}]},
            {"type": "stat", "targets": [{"expr": "c"}, {"refId": "B"}]},
        ]
    }
    assert panel_queries(board) == ["a", "b", "c"]


def test_runnable_query_substitutes_grafana_variables() -> None:
    expr = 'rate(x{heterotrain_job="$job"}[$__rate_interval]) + y{a="${job}"}'
    assert runnable_query(expr, {"job": "j1"}) == 'rate(x{heterotrain_job="j1"}[1m]) + y{a="j1"}'
    with pytest.raises(ValueError, match="still has a variable"):
        runnable_query('x{a="$unknown"}', {})


@settings(max_examples=40, deadline=None)
@given(job=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True))
def test_every_query_parses_for_any_job_name(job: str) -> None:
    for board in checked_in().values():
        for expr in panel_queries(board):
            assert series_read_by(runnable_query(expr, {"job": job, "datasource": "p"}))
