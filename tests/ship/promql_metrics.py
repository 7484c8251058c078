"""Which series a PromQL expression reads, and which series our exporters actually export."""

from __future__ import annotations

import promql_parser
from prometheus_client import CollectorRegistry

# prometheus-client's exported series per metric family type.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
}


def series_read_by(expr: str) -> set[str]:
    """Metric names of every vector selector in `expr` (which must have no Grafana variables left)."""
    found: set[str] = set()

    def visit(node: object) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.add(str(node.name))
        return True

    promql_parser.walk(promql_parser.parse(expr), pre_visit=visit)
    return found


def exported_series(registry: CollectorRegistry) -> dict[str, str]:
    """Series name to the metric family that exports it."""
    series: dict[str, str] = {}
    for family in registry.collect():
        for suffix in _SUFFIXES[family.type]:
            series[family.name + suffix] = family.name
    return series
