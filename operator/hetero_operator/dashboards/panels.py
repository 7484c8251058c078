"""Small builders for the panels both dashboards use, on grafana-foundation-sdk's types."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from grafana_foundation_sdk.builders import dashboard as board
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.builders.common import StackingConfig, VizLegendOptions
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import (
    BigValueGraphMode,
    LegendDisplayMode,
    LegendPlacement,
    StackingMode,
)

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = model.DataSourceRef(type_val="prometheus", uid=f"${{{DATASOURCE_VARIABLE}}}")
FULL_WIDTH = 24


@dataclass(frozen=True)
class Query:
    """One PromQL target and how its series are named in the legend."""

    expr: str
    legend: str = ""


def _targets(queries: Sequence[Query]) -> list[Builder[variants.Dataquery]]:
    if not queries:
        raise ValueError("a panel needs at least one query")
    return [
        prometheus.Dataquery()
        .expr(query.expr)
        .legend_format(query.legend or "__auto")
        .ref_id(chr(ord("A") + index))
        .datasource(DATASOURCE)
        for index, query in enumerate(queries)
    ]


Framed = TypeVar("Framed", timeseries.Panel, stat.Panel)


def _framed(
    panel: Framed,
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    width: int,
    height: int,
) -> Framed:
    """What every panel has: its title, help text, data source, queries, unit and place on the grid."""
    return (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
    )


def time_series(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    width: int = 12,
    height: int = 8,
    stacked: bool = False,
) -> timeseries.Panel:
    panel = _framed(timeseries.Panel(), title, description, queries, unit, width, height).legend(
        VizLegendOptions()
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["lastNotNull", "max"])
    )
    if stacked:
        panel = panel.stacking(StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(30)
    return panel


def single_stat(
    title: str, description: str, queries: Sequence[Query], unit: str, width: int = 6, height: int = 4
) -> stat.Panel:
    return _framed(stat.Panel(), title, description, queries, unit, width, height).graph_mode(
        BigValueGraphMode.AREA
    )


def row(title: str) -> board.Row:
    return board.Row(title)


def datasource_variable() -> board.DatasourceVariable:
    return board.DatasourceVariable(DATASOURCE_VARIABLE).label("Data source").type("prometheus")


def label_variable(name: str, label: str, metric: str, label_name: str) -> board.QueryVariable:
    """A drop-down of the values `label_name` takes on `metric`."""
    return (
        board.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {label_name})")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def new_dashboard(uid: str, title: str, description: str, tags: Sequence[str]) -> board.Dashboard:
    return (
        board.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(list(tags))
        .editable()
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .with_variable(datasource_variable())
    )
