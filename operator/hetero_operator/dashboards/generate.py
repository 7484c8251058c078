"""Command line of the dashboard generator: python -m hetero_operator.dashboards --out DIR [--check]"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hetero_operator.dashboards.export import DEFAULT_OUT, stale_files, write_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the Grafana dashboards from the metric names.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Directory for the JSON files.")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if the files are stale.")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_files(options.out)
        for name in stale:
            print(
                f"{options.out / name} is out of date: run python -m hetero_operator.dashboards",
                file=sys.stderr,
            )
        return 1 if stale else 0
    for path in write_all(options.out):
        print(path)
    return 0
