"""Command line of the dashboard generator: python -m hetero_operator.dashboards --out DIR [--check]"""

from __future__ import annotations

from hetero_operator.dashboards.export import DEFAULT_OUT, rendered_files
from hetero_operator.generated_files import generator_main


def main(argv: list[str] | None = None) -> int:
    return generator_main(
        argv,
        "Generate the Grafana dashboards from the metric names.",
        DEFAULT_OUT,
        rendered_files,
        "hetero_operator.dashboards",
    )
