"""Grafana dashboards ("GPU pools", "Training job") generated from the metric-name constants.

python -m hetero_operator.dashboards --out helm/heterotrain/dashboards           # write the JSON
python -m hetero_operator.dashboards --out helm/heterotrain/dashboards --check   # exit 1 if stale

`panel_queries(dashboard_json)` lists every panel's PromQL, for tests that run them against Prometheus.
"""

from hetero_operator.dashboards.export import (
    DASHBOARDS,
    dashboard_json,
    panel_queries,
    runnable_query,
)

__all__ = ["DASHBOARDS", "dashboard_json", "panel_queries", "runnable_query"]
