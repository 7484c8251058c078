"""Fixtures for the reliability tests: the shared ledger that becomes RELIABILITY.md."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from tests.reliability.faults_bed import start_bed
from tests.reliability.ledger import UNRECORDED, Ledger, still_exists, write

from hetero_operator.testbed.cluster import Testbed

RELIABILITY_MD = Path(__file__).resolve().parents[2] / "RELIABILITY.md"
FAILURES = pytest.StashKey[dict[str, str]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    """Remember why a reliability test failed, so one that failed before recording still gets a row."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and "record" in getattr(item, "fixturenames", ()):
        lines = [line for line in report.longreprtext.splitlines() if line.startswith("E ")]
        reason = " ".join(line[1:].strip() for line in lines[:3]) or report.longreprtext[-300:]
        item.config.stash.setdefault(FAILURES, {}).setdefault(item.nodeid, f"{report.when}: {reason[:500]}")


@pytest.fixture(scope="session")
def ledger(request: pytest.FixtureRequest) -> Iterator[Ledger]:
    """Rows recorded by every reliability test; merged into RELIABILITY.md when the session ends."""
    book = Ledger()
    yield book
    ran = {item.nodeid for item in request.session.items if "tests/reliability/" in item.nodeid}
    recorded = {row.test for row in book.rows}
    for test, reason in request.config.stash.get(FAILURES, {}).items():
        if test not in recorded:
            what = "the test failed before it recorded what it tried"
            book.record(area=UNRECORDED, what=what, trials=0, survived=0, lost=reason, checks="-", test=test)
    if book.rows:
        write(RELIABILITY_MD, book.rows, len(ran), ran, still_exists(RELIABILITY_MD.parent))


@pytest.fixture
def record(ledger: Ledger, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """`record(area=..., what=..., trials=..., survived=..., lost=..., checks=...)` for this test."""

    def add(**fields: object) -> None:
        ledger.record(test=request.node.nodeid, **fields)  # type: ignore[arg-type]

    return add


@pytest.fixture(scope="session")
def fault_bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """A test bed for destructive faults (crashed control plane, lost nodes, stopped Prometheus), apart
    from the session's shared one: fake KWOK nodes of their own class and three local process nodes.
    Each fault test leaves it as it found it."""
    bed = start_bed(tmp_path_factory.mktemp("fault-bed"), local=True)
    try:
        yield bed
    finally:
        bed.down()
