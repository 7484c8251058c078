"""Files the project generates from its code (CRDs, chart templates, dashboards): one way to write them,
to find the stale ones, and one command line for every generator."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

Rendered = Mapping[str, str]  # file name -> its text


def stale_names(out: Path, rendered: Rendered) -> list[str]:
    """Names of the files in `out` that are missing or differ from their rendered text."""
    return [
        name
        for name, text in rendered.items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    ]


def write_rendered(out: Path, rendered: Rendered) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def generator_main(
    argv: list[str] | None,
    description: str,
    default_out: Path,
    render_all: Callable[[], Rendered],
    module: str,
) -> int:
    """`--out DIR` writes the files; `--check` writes nothing and exits 1 naming each stale file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out, help="Directory for the generated files.")
    parser.add_argument("--check", action="store_true", help="Write nothing; exit 1 if the files are stale.")
    options = parser.parse_args(argv)
    if options.check:
        stale = stale_names(options.out, render_all())
        for name in stale:
            print(f"{options.out / name} is out of date: run python -m {module}", file=sys.stderr)
        return 1 if stale else 0
    for path in write_rendered(options.out, render_all()):
        print(path)
    return 0
