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
from collections.abc import Callable, Iterable
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
    ran_on: str = ""  # what the trials ran against; empty: the live test bed (LIVE)


@dataclass
class Ledger:
    rows: list[Row] = field(default_factory=list)

    def record(
        self,
        *,
        area: str,
        what: str,
        trials: int,
        survived: int,
        lost: str,
        checks: str,
        test: str = "",
        ran_on: str = "",
    ) -> Row:
        row = Row(area, what, trials, survived, lost, checks, test, ran_on=ran_on)
        self.rows.append(row)
        return row


AREA_ORDER = ("fault", "high availability", "bad input", "security")
UNRECORDED = "failed before recording"
COLUMNS = ("What was done", "Trials", "Survived", "Lost", "Checks", "Ran on", "Test", "Run")
# The live test bed: kube-apiserver + etcd, KWOK nodes, local process nodes running real workers,
# Prometheus. A row that ran against anything else names it (fakes by name) in its Ran on column.
LIVE = "test bed"


def ran_on(row: Row) -> str:
    return row.ran_on or LIVE


def still_exists(root: Path) -> Callable[[str], bool]:
    """Whether a pytest node id (`path::name[params]`) still names a test function under `root`."""

    def exists(node: str) -> bool:
        path, _, name = node.partition("::")
        file = root / path
        return file.is_file() and f"def {name.split('[')[0]}(" in file.read_text()

    return exists


def _area_rank(area: str) -> tuple[int, str]:
    return (AREA_ORDER.index(area), "") if area in AREA_ORDER else (len(AREA_ORDER), area)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render(rows: list[Row], selected_tests: int, when: datetime.datetime) -> str:
    """RELIABILITY.md: totals per area and per what the rows ran against (never one sum over trials
    of different kinds), then one table row per ledger row, grouped by area."""
    stamp = f"{when:%Y-%m-%d %H:%M}"
    fresh = sum(1 for row in rows if not row.run)
    rows = [row if row.run else replace(row, run=stamp) for row in rows]
    elsewhere = sum(1 for row in rows if ran_on(row) != LIVE)
    lines = [
        "# Reliability",
        "",
        "Written by the test run itself (`tests/reliability`): what each test tried and what survived.",
        "Each trial is one injected fault or one bad input; a trial *survived* when every check listed",
        "for it held afterwards. A row's Ran on column says what its trials ran against: *test bed* is",
        "the live local test bed (a real kube-apiserver and etcd, KWOK nodes, local process nodes running",
        "real torch workers over gloo, Prometheus); any other entry names what stood in for it, fakes",
        f"included ({elsewhere} of the {len(rows)} rows here did not run on the test bed).",
        "A run replaces the rows of the tests it ran and keeps the others, so the Run column says when",
        "each row was last produced.",
        "",
        f"Last written: {stamp} UTC on {platform.system()} {platform.machine()}; {selected_tests} "
        f"reliability tests selected, {fresh} rows from this run, {len(rows) - fresh} kept from "
        "earlier runs.",
        "",
        "Totals per area and per what the trials ran against. Trials of different kinds are not added",
        "together beyond this: a row's own trials are split by kind in its What column where they differ.",
        "",
        "| Area | Ran on | Rows | Trials | Survived | Rows that lost something |",
        "|---|---|---|---|---|---|",
    ]
    areas = sorted({row.area for row in rows}, key=_area_rank)
    for area in areas:
        mine = [row for row in rows if row.area == area]
        for where in sorted({ran_on(row) for row in mine}, key=lambda w: (w != LIVE, w)):
            part = [row for row in mine if ran_on(row) == where]
            lossy = sum(1 for row in part if row.survived < row.trials or row.area == UNRECORDED)
            trials, survived = sum(r.trials for r in part), sum(r.survived for r in part)
            lines.append(f"| {area} | {where} | {len(part)} | {trials} | {survived} | {lossy} |")
    lines.append("")
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
                    ran_on(row),
                    f"`{row.test}`",
                    row.run,
                ]
                lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
        lines.append("")
    return "\n".join(lines)


_UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def parse(text: str) -> list[Row]:
    """The rows of a RELIABILITY.md that `render` wrote (older files without the Run or Ran on
    column too: their rows ran on the test bed)."""
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
        where = cells.pop(5) if len(cells) >= len(COLUMNS) else LIVE
        where = "" if where == LIVE else where
        with contextlib.suppress(ValueError):
            what, trials, survived, lost, checks, test = cells[:6]
            run = cells[6] if len(cells) > 6 else ""
            rows.append(
                Row(area, what, int(trials), int(survived), lost, checks, test.strip("`"), run, where)
            )
    return rows


def merge(
    previous: Iterable[Row], fresh: Iterable[Row], ran: set[str], exists: Callable[[str], bool] | None = None
) -> list[Row]:
    """This run's rows, plus the earlier rows of tests that did not run now and still exist (a test
    renamed or removed takes its rows with it); grouped by test file."""
    kept = [row for row in previous if row.test not in ran and (exists is None or exists(row.test))]
    combined = [*kept, *fresh]
    return sorted(combined, key=lambda row: (_area_rank(row.area), row.test.split("::")[0]))


def write(
    path: Path,
    rows: list[Row],
    selected_tests: int,
    ran: set[str] | None = None,
    exists: Callable[[str], bool] | None = None,
) -> None:
    """Write RELIABILITY.md; with `ran` (the node ids of the tests this run selected), merge with the
    rows already in it (of tests that still `exist`). A lock keeps two test sessions that end together
    from losing each other's rows."""
    now = datetime.datetime.now(datetime.UTC)
    with path.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        previous = parse(handle.read()) if ran is not None else []
        text = render(merge(previous, rows, ran or set(), exists), selected_tests, now)
        handle.seek(0)
        handle.truncate()
        handle.write(text)
