"""BENCHMARKS.md is shared by every benchmark: each one replaces its own `## ` section only."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCHMARKS_MD = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def replace_section(text: str, path: Path = BENCHMARKS_MD) -> None:
    """Put `text` (starting with its `## heading` line) in place of that section, or append it."""
    heading = text.splitlines()[0]
    existing = path.read_text() if path.exists() else "# Benchmarks\n"
    if heading in existing:
        start = existing.index(heading)
        following = existing.find("\n## ", start + len(heading))
        rest = existing[following + 1 :] if following != -1 else ""
        updated = existing[:start] + text.rstrip("\n") + "\n" + ("\n" + rest if rest else "")
    else:
        updated = existing.rstrip("\n") + "\n\n" + text.rstrip("\n") + "\n"
    path.write_text(updated)


def publish(artifact: dict[str, Any], text: str, artifact_path: Path, write: bool) -> None:
    """Print a run's section; with `write`, keep its artifact and put the section in BENCHMARKS.md."""
    print(text)
    if write:
        artifact_path.parent.mkdir(parents=True, exist_ok=True)
        artifact_path.write_text(json.dumps(artifact, indent=1) + "\n")
        replace_section(text)


def section_arguments(parser: argparse.ArgumentParser) -> None:
    """`--write` (regenerate the section too) and `--from-json FILE` (only the section, from a
    committed artifact)."""
    parser.add_argument("--write", action="store_true", help="regenerate BENCHMARKS.md's section")
    parser.add_argument("--from-json", type=Path, help="only regenerate the section from this artifact")


def rendered_from_json(args: argparse.Namespace, report: Callable[[dict[str, Any]], str]) -> bool:
    """With `--from-json`, regenerate the section from that artifact and say so (nothing is run)."""
    if args.from_json is None:
        return False
    replace_section(report(json.loads(args.from_json.read_text())))
    return True
