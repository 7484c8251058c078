"""Turn the dashboard builders into the JSON files the chart ships, and read queries back out of them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders.dashboard import Dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as model_dashboard

from hetero_operator.dashboards.gpu_pools import gpu_pools
from hetero_operator.dashboards.training_job import training_job
from hetero_operator.generated_files import stale_names

DEFAULT_OUT = Path("helm/heterotrain/dashboards")
DASHBOARDS: dict[str, Callable[[], Dashboard]] = {
    "gpu-pools.json": gpu_pools,
    "training-job.json": training_job,
}
# What Grafana substitutes for its built-in interval variables when a query runs without Grafana.
DEFAULT_GRAFANA_VARIABLES = {"__rate_interval": "1m", "__interval": "30s", "__range": "1h"}


def dashboard_json(builder: Dashboard) -> dict[str, Any]:
    """The dashboard model as Grafana's JSON (a plain dict), panels numbered 1, 2, ... in order:
    Grafana links to and edits panels by id, so ids must be unique and stable."""
    model = builder.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
    return canonical(_encode(model))


def canonical(dashboard: Mapping[str, Any]) -> dict[str, Any]:
    """`dashboard` decoded into the SDK's types and encoded again. The SDK's decoder fills in a few
    defaults its builders leave out (such as empty `custom` field options); one pass makes the JSON a
    fixed point, so a file equal to its own round trip is known to fit the SDK's model exactly."""
    register_default_plugins()
    return _encode(model_dashboard.Dashboard.from_json(dict(dashboard)))


def _encode(model: object) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    return decoded


def render(builder: Dashboard) -> str:
    """The file text, byte for byte: stable key order so regeneration gives no diff."""
    return json.dumps(dashboard_json(builder), indent=2, sort_keys=True) + "\n"


def rendered_files() -> dict[str, str]:
    return {name: render(factory()) for name, factory in DASHBOARDS.items()}


def stale_files(out: Path) -> list[str]:
    """Dashboard files in `out` that are missing or differ from the generator's output."""
    return stale_names(out, rendered_files())


def panels_of(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel that shows data (rows are containers), including panels nested in collapsed rows."""
    for panel in dashboard.get("panels") or []:
        if panel.get("type") == "row":
            yield from panels_of(panel)
        else:
            yield panel


def panel_queries(dashboard: Mapping[str, Any]) -> list[str]:
    """Every PromQL expression of every panel, in panel order, with Grafana's variables still in."""
    return [
        str(target["expr"])
        for panel in panels_of(dashboard)
        for target in panel.get("targets") or []
        if target.get("expr")
    ]


def runnable_query(expr: str, variables: Mapping[str, str]) -> str:
    """`expr` with `$name` / `${name}` replaced, Grafana's interval variables defaulting to fixed
    windows, so Prometheus can run it directly. Longest names first: `$__rate_interval` before `$__r...`."""
    values = {**DEFAULT_GRAFANA_VARIABLES, **variables}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(f"${{{name}}}", values[name]).replace(f"${name}", values[name])
    if "$" in expr:
        raise ValueError(f"query still has a variable after substitution (pass it in `variables`): {expr}")
    return expr
