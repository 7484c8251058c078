"""How long `make test` takes, from the JUnit reports of whole-suite runs (one per way of running it).

Each report is one run of the whole suite (`pytest --junitxml=FILE`); its label says how it ran. The
artifact keeps, per run: the commit, the tests, failures and skips, the wall time of the session, the
summed test time per folder (on several workers, the sum is more than the wall time) and the slowest
tests. A run's start log (`+FILE`: the run with HETEROTRAIN_START_LOG=FILE and bench/start_log first on
PYTHONPATH) adds how many Python interpreters started fresh, how many started warm, and how many test
beds booted. A run's CPU log (a second `+FILE`: the run with HETEROTRAIN_CPU_LOG=FILE, bench/cpu_log on
PYTHONPATH and `-p cpu_by_test`) adds the CPU seconds each worker's processes used beside its test
time, with the folder that took most of that worker's time. `--write` keeps the artifact
(bench/results/suite_time.json) and regenerates
BENCHMARKS.md's "## Test suite" section; `--from-json FILE` regenerates only the section.

    python bench/suite_time.py --run "one worker@COMMIT=serial.xml+starts.log[+cpu.log]" --append --write
"""

from __future__ import annotations

import argparse
import json
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
    "`python bench/suite_time.py --write` from the JUnit reports of whole-suite runs (`make test`, or "
    "pytest over the whole suite, as each label says; pytest only: the set-up and lint before it are "
    "not counted). Wall time is the pytest session's; test time is the sum over tests, which two workers "
    "spend side by side. Python starts and test-bed boots are counted where the run kept a start log "
    "(bench/start_log). The table is generated from `bench/results/suite_time.json`."
)


SLOWEST = 15


def read_starts(path: Path) -> dict[str, int]:
    """Lines of a start log by their first word: cold and warm Python starts, test beds booted."""
    kinds = Counter(line.split(" ", 1)[0] for line in path.read_text().splitlines() if line.strip())
    return {
        "cold_python_starts": kinds["cold"],
        "warm_python_starts": kinds["warm"],
        "test_beds": kinds["bed"],
    }


def read_cpu(path: Path) -> dict[str, Any]:
    """Per worker, from a CPU log: its processes' CPU seconds, its tests' seconds, its main folder."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    workers: dict[str, dict[str, Any]] = {}
    for worker in sorted({row["worker"] for row in rows}):
        mine = [row for row in rows if row["worker"] == worker]
        folders: Counter[str] = Counter()
        for row in mine:
            folders["/".join(row["test"].split("/")[:2])] += row["wall_s"]
        workers[worker] = {
            "cpu_seconds": round(sum(row["cpu_s"] for row in mine), 1),
            "test_seconds": round(sum(row["wall_s"] for row in mine), 1),
            "main_folder": folders.most_common(1)[0][0],
        }
    return {"cpu_per_worker": workers}


def read_report(
    label: str, commit: str, path: Path, starts: Path | None = None, cpu: Path | None = None
) -> dict[str, Any]:
    """One run's figures from its JUnit report (and its start log)."""
    suite = ET.parse(path).getroot().find("testsuite")
    if suite is None:
        raise SystemExit(f"{path}: no <testsuite> element; pass the file `pytest --junitxml` wrote")
    per_folder: Counter[str] = Counter()
    per_test: dict[str, float] = {}
    for case in suite.iter("testcase"):
        folder = "/".join((case.get("classname") or "").split(".")[:2])
        seconds = float(case.get("time") or 0.0)
        per_folder[folder] += seconds
        per_test[f"{case.get('classname')}::{case.get('name')}"] = seconds
    slowest = sorted(per_test.items(), key=lambda item: -item[1])[:SLOWEST]
    return {
        "label": label,
        "commit": commit,
        "started": suite.get("timestamp"),
        "tests": int(suite.get("tests") or 0),
        "failures": int(suite.get("failures") or 0) + int(suite.get("errors") or 0),
        "skipped": int(suite.get("skipped") or 0),
        "wall_seconds": round(float(suite.get("time") or 0.0), 1),
        "test_seconds_per_folder": {k: round(v, 1) for k, v in per_folder.most_common()},
        "slowest_tests": {name: round(seconds, 1) for name, seconds in slowest},
        **(read_starts(starts) if starts is not None else {}),
        **(read_cpu(cpu) if cpu is not None else {}),
    }


def report(document: dict[str, Any]) -> str:
    runs = document["runs"]
    lines = [
        f"{HEADING}\n\n{INTRO}\n\nRun on {document['machine']}.\n",
        "| Run | Commit | Tests | Failed | Skipped | Wall min | Test time min | Python starts, fresh / warm "
        "| Test beds booted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        summed = sum(run["test_seconds_per_folder"].values())
        counted = "cold_python_starts" in run
        starts = f"{run['cold_python_starts']} / {run['warm_python_starts']}" if counted else "not counted"
        beds = str(run["test_beds"]) if counted else "not counted"
        lines.append(
            f"| {run['label']} | {run['commit']} | {run['tests']} | {run['failures']} | {run['skipped']} "
            f"| {run['wall_seconds'] / 60:.1f} | {summed / 60:.1f} | {starts} | {beds} |"
        )
    lines += ["", "Test time per folder, minutes:", ""]
    folders = {f for run in runs for f in run["test_seconds_per_folder"]}
    lines.append("| Folder | " + " | ".join(f"{run['label']} ({run['commit']})" for run in runs) + " |")
    lines.append("|---|" + "---|" * len(runs))
    for folder in sorted(folders, key=lambda f: -max(r["test_seconds_per_folder"].get(f, 0) for r in runs)):
        cells = [f"{run['test_seconds_per_folder'].get(folder, 0.0) / 60:.1f}" for run in runs]
        lines.append(f"| {folder} | " + " | ".join(cells) + " |")
    with_cpu = [run for run in runs if run.get("cpu_per_worker")]
    if with_cpu:
        lines += ["", "CPU by worker (the run's processes, test beds and ranks included), minutes:", ""]
        lines += ["| Run | Commit | Worker (its main folder) | CPU | Test time |", "|---|---|---|---|---|"]
        for run in with_cpu:
            for worker, used in run["cpu_per_worker"].items():
                lines.append(
                    f"| {run['label']} | {run['commit']} | {worker} ({used['main_folder']}) "
                    f"| {used['cpu_seconds'] / 60:.1f} | {used['test_seconds'] / 60:.1f} |"
                )
    newest = runs[-1]
    if newest.get("slowest_tests"):
        lines += [
            "",
            f"The slowest tests of the last run ({newest['label']}, {newest['commit']}), seconds:",
            "",
        ]
        lines += ["| Test | Seconds |", "|---|---|"]
        lines += [f"| `{name}` | {seconds:.1f} |" for name, seconds in newest["slowest_tests"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run",
        action="append",
        default=[],
        help="LABEL@COMMIT=JUNIT_XML[+START_LOG[+CPU_LOG]], once per run",
    )
    parser.add_argument(
        "--append", action="store_true", help="keep the artifact's runs and add these after them"
    )
    section_arguments(parser)
    args = parser.parse_args()
    if rendered_from_json(args, report):
        return
    runs = []
    for spec in args.run:
        head, _, files = spec.rpartition("=")
        label, _, commit = head.rpartition("@")
        path, *logs = files.split("+")
        if not (label and commit and path) or len(logs) > 2:
            raise SystemExit(f"--run {spec!r}: expected LABEL@COMMIT=JUNIT_XML[+START_LOG[+CPU_LOG]]")
        starts, cpu = [*logs, "", ""][:2]
        runs.append(
            read_report(
                label, commit, Path(path), Path(starts) if starts else None, Path(cpu) if cpu else None
            )
        )
    if not runs:
        raise SystemExit("--run: give at least one LABEL@COMMIT=JUNIT_XML")
    if args.append and ARTIFACT.exists():
        runs = json.loads(ARTIFACT.read_text())["runs"] + runs
    cores = len(os.sched_getaffinity(0))
    document = {"machine": f"{cores} cores, {platform.system()} {platform.machine()}", "runs": runs}
    publish(document, report(document), ARTIFACT, args.write)


if __name__ == "__main__":
    main()
