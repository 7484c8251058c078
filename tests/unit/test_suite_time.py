"""bench/suite_time.py: a whole-suite run's figures from its JUnit report, and the section they render."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"

REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
 errors="1" failures="1" skipped="2" tests="5" time="120.5" timestamp="2026-11-28T04:49:08">
<testcase classname="tests.e2e.test_a" name="t1" time="60.0"/>
<testcase classname="tests.e2e.test_b" name="t2" time="30.0"/>
<testcase classname="tests.unit.test_c" name="t3" time="0.5"/>
</testsuite></testsuites>"""


def test_a_runs_figures_are_its_reports_and_the_section_shows_them(tmp_path: Path) -> None:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    suite_time = importlib.import_module("suite_time")
    path = tmp_path / "report.xml"
    path.write_text(REPORT)
    run = suite_time.read_report("one worker", "abc1234", path)
    assert (run["tests"], run["failures"], run["skipped"], run["wall_seconds"]) == (5, 2, 2, 120.5)
    assert run["test_seconds_per_folder"] == {"tests/e2e": 90.0, "tests/unit": 0.5}
    assert run["slowest_tests"] == {
        "tests.e2e.test_a::t1": 60.0,
        "tests.e2e.test_b::t2": 30.0,
        "tests.unit.test_c::t3": 0.5,
    }
    section = suite_time.report({"machine": "2 cores", "runs": [run]})
    assert "| one worker | abc1234 | 5 | 2 | 2 | 2.0 | 1.5 | not counted | not counted |" in section
    assert "| tests/e2e | 1.5 |" in section
    assert "| `tests.e2e.test_a::t1` | 60.0 |" in section
    starts = tmp_path / "starts.log"
    starts.write_text("cold 1 python -m pytest\nwarm 2 x\nwarm 3 y\nbed 1 /tmp/bed\ncold 4 agent\n")
    counted = suite_time.read_report("warm", "def5678", path, starts)
    assert (counted["cold_python_starts"], counted["warm_python_starts"], counted["test_beds"]) == (2, 2, 1)
    assert "| 2 / 2 | 1 |" in suite_time.report({"machine": "2 cores", "runs": [counted]})
