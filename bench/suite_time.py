"""How long `make test` takes, from the JUnit reports of whole-suite runs (one per way of running it).

Each report is one run of the whole suite (`pytest --junitxml=FILE`); its label says how it ran. The
artifact keeps, per run: the commit, the tests, failures and skips, the wall time of the session, and
the summed test time per folder (on several workers, the sum is more than the wall time). `--write`
keeps the artifact (bench/results/suite_time.json) and regenerates BENCHMARKS.md's "## Test suite"
section; `--from-json FILE` regenerates only the section.

    python bench/suite_time.py --run "one worker@COMMIT=serial.xml" --run "two workers@COMMIT=par.xml" --write
"""

from __future__ import annotations

import argparse
import os
import platform
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks_md import publish, rendered_from_json, section_arguments

ARTIFACT = Path(__file__).resolve().parent / "results" / "suite_time.json"
HEADING = "## Test suite"
INTRO = (
    "`python bench/suite_time.py --write` from the JUnit reports of whole `make test` runs (pytest only: "
    "the set-up and lint before it are not counted). Wall time is the pytest session's; test time is "
    "the sum over tests, which two workers spend side by side. The table is generated from "
    "`bench/results/suite_time.json`."
)


def read_report(label: str, commit: str, path: Path) -> dict[str, Any]:
    """One run's figures from its JUnit report."""
    suite = ET.parse(path).getroot().find("testsuite")
    if suite is None:
        raise SystemExit(f"{path}: no <testsuite> element; pass the file `pytest --junitxml` wrote")
    per_folder: Counter[str] = Counter()
    for case in suite.iter("testcase"):
        folder = "/".join((case.get("classname") or "").split(".")[:2])
        per_folder[folder] += float(case.get("time") or 0.0)
    return {
        "label": label,
        "commit": commit,
        "started": suite.get("timestamp"),
        "tests": int(suite.get("tests") or 0),
        "failures": int(suite.get("failures") or 0) + int(suite.get("errors") or 0),
        "skipped": int(suite.get("skipped") or 0),
        "wall_seconds": round(float(suite.get("time") or 0.0), 1),
        "test_seconds_per_folder": {k: round(v, 1) for k, v in per_folder.most_common()},
    }


def report(document: dict[str, Any]) -> str:
    runs = document["runs"]
    lines = [
        f"{HEADING}\n\n{INTRO}\n\nRun on {document['machine']}.\n",
        "| Run | Commit | Tests | Failed | Skipped | Wall min | Test time min |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        summed = sum(run["test_seconds_per_folder"].values())
        lines.append(
            f"| {run['label']} | {run['commit']} | {run['tests']} | {run['failures']} | {run['skipped']} "
            f"| {run['wall_seconds'] / 60:.1f} | {summed / 60:.1f} |"
        )
    lines += ["", "Test time per folder, minutes:", ""]
    folders = {f for run in runs for f in run["test_seconds_per_folder"]}
    lines.append("| Folder | " + " | ".join(f"{run['label']} ({run['commit']})" for run in runs) + " |")
    lines.append("|---|" + "---|" * len(runs))
    for folder in sorted(folders, key=lambda f: -max(r["test_seconds_per_folder"].get(f, 0) for r in runs)):
        cells = [f"{run['test_seconds_per_folder'].get(folder, 0.0) / 60:.1f}" for run in runs]
        lines.append(f"| {folder} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", action="append", default=[], help="LABEL@COMMIT=JUNIT_XML, once per run")
    section_arguments(parser)
    args = parser.parse_args()
    if rendered_from_json(args, report):
        return
    runs = []
    for spec in args.run:
        head, _, path = spec.rpartition("=")
        label, _, commit = head.rpartition("@")
        if not (label and commit and path):
            raise SystemExit(f"--run {spec!r}: expected LABEL@COMMIT=JUNIT_XML")
        runs.append(read_report(label, commit, Path(path)))
    if not runs:
        raise SystemExit("--run: give at least one LABEL@COMMIT=JUNIT_XML")
    cores = len(os.sched_getaffinity(0))
    document = {"machine": f"{cores} cores, {platform.system()} {platform.machine()}", "runs": runs}
    publish(document, report(document), ARTIFACT, args.write)


if __name__ == "__main__":
    main()
