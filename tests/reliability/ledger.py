"""The reliability ledger: every fault and bad input a test tried, and what survived it.

Tests record a row *before* asserting, so a failing trial still shows up in the table. At the end of
the session the rows become RELIABILITY.md at the repository root, merged with the rows already there:
a test that ran replaces its old rows, rows of tests that did not run this time are kept (with the
time of the run that produced them), so a partial run never hides what a full run found.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class Row:
    """One kind of fault or bad input, tried `trials` times."""

    area: str  # "fault", "high availability", "bad input", "security"
    what: str  # what was done, e.g. "operator SIGKILLed at a random point of a job lifecycle"
    trials: int
    survived: int  # trials after which every check held
    lost: str  # what was lost across all trials; "nothing" is the target
    checks: str  # what "survived" means for this row
    test: str = ""  # pytest node id that produced the row
    run: str = ""  # when the run that produced it ended ("YYYY-MM-DD HH:MM" UTC); set when written


@dataclass
class Ledger:
    rows: list[Row] = field(default_factory=list)

    def record(
        self, *, area: str, what: str, trials: int, survived: int, lost: str, checks: str, test: str = ""
    ) -> Row:
        row = Row(area, what, trials, survived, lost, checks, test)
        self.rows.append(row)
        return row


AREA_ORDER = ("fault", "high availability", "bad input", "security")
UNRECORDED = "failed before recording"
COLUMNS = ("What was done", "Trials", "Survived", "Lost", "Checks", "Test", "Run")


def _area_rank(area: str) -> tuple[int, str]:
    return (AREA_ORDER.index(area), "") if area in AREA_ORDER else (len(AREA_ORDER), area)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rows: list[Row], selected_tests: int, when: datetime.datetime) -> str:
    """RELIABILITY.md: a summary per area, then one table row per ledger row, grouped by area."""
    stamp = f"{when:%Y-%m-%d %H:%M}"
    fresh = sum(1 for row in rows if not row.run)
    rows = [row if row.run else replace(row, run=stamp) for row in rows]
    lines = [
        "# Reliability",
        "",
        "Written by the test run itself (`tests/reliability`): what each test tried and what survived.",
        "Every row is a bounded experiment on the local test bed; a trial *survived* when every check",
        "listed for it held afterwards. A run replaces the rows of the tests it ran and keeps the others,",
        "so the Run column says when each row was last produced.",
        "",
        f"Last written: {stamp} UTC on {platform.system()} {platform.machine()}; {selected_tests} "
        f"reliability tests selected, {fresh} rows from this run, {len(rows) - fresh} kept from "
        "earlier runs.",
        "",
        "| Area | Rows | Trials | Survived | Rows that lost something |",
        "|---|---|---|---|---|",
    ]
    areas = sorted({row.area for row in rows}, key=_area_rank)
    for area in areas:
        mine = [row for row in rows if row.area == area]
        lossy = sum(1 for row in mine if row.survived < row.trials or row.area == UNRECORDED)
        trials, survived = sum(r.trials for r in mine), sum(r.survived for r in mine)
        lines.append(f"| {area} | {len(mine)} | {trials} | {survived} | {lossy} |")
    total_trials = sum(row.trials for row in rows)
    total_survived = sum(row.survived for row in rows)
    lines += ["", f"Trials: {total_trials}; survived: {total_survived}.", ""]
    for area in areas:
        lines += [
            f"## {area[0].upper()}{area[1:]}",
            "",
            "| " + " | ".join(COLUMNS) + " |",
            "|" + "---|" * len(COLUMNS),
        ]
        for row in rows:
            if row.area == area:
                cells = [
                    row.what,
                    str(row.trials),
                    str(row.survived),
                    row.lost,
                    row.checks,
                    f"`{row.test}`",
                    row.run,
                ]
                lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def parse(text: str) -> list[Row]:
    """The rows of a RELIABILITY.md that `render` wrote (older files without a Run column too)."""
    rows: list[Row] = []
    area: str | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            area = heading[:1].lower() + heading[1:]
            continue
        if area is None or not line.startswith("| ") or line.startswith(("| What was done", "|---")):
            continue
        cells = [c.strip().replace("\\|", "|") for c in _UNESCAPED_PIPE.split(line.strip()[1:-1])]
        if len(cells) < 6:
            continue
        with contextlib.suppress(ValueError):
            what, trials, survived, lost, checks, test = cells[:6]
            run = cells[6] if len(cells) > 6 else ""
            rows.append(Row(area, what, int(trials), int(survived), lost, checks, test.strip("`"), run))
    return rows


def merge(previous: Iterable[Row], fresh: Iterable[Row], ran: set[str]) -> list[Row]:
    """This run's rows, plus the earlier rows of tests that did not run now; grouped by test file."""
    kept = [row for row in previous if row.test not in ran]
    combined = [*kept, *fresh]
    return sorted(combined, key=lambda row: (_area_rank(row.area), row.test.split("::")[0]))


def write(path: Path, rows: list[Row], selected_tests: int, ran: set[str] | None = None) -> None:
    """Write RELIABILITY.md; with `ran` (the node ids of the tests this run selected), merge with the
    rows already in it. A lock keeps two test sessions that end together from losing each other's rows."""
    now = datetime.datetime.now(datetime.UTC)
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        previous = parse(handle.read()) if ran is not None else []
        text = render(merge(previous, rows, ran or set()), selected_tests, now)
        handle.seek(0)
        handle.truncate()
        handle.write(text)
