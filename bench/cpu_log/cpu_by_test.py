"""CPU time by test, for bench/suite_time.py: loaded with `-p cpu_by_test` (this folder on PYTHONPATH)
and HETEROTRAIN_CPU_LOG naming a file, each pytest process (each xdist worker) moves itself into a
cpuacct cgroup of its own, which every process it starts inherits (test beds, ranks, warm servers),
and appends a JSON line per test: its node id, its worker, and the CPU seconds and wall seconds from
its setup to its teardown. Needs a writable cgroup v1 cpuacct hierarchy; without one it logs nothing."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_group: Path | None = None


def _worker(config: pytest.Config) -> str:
    return str(getattr(config, "workerinput", {}).get("workerid", "main"))


def pytest_configure(config: pytest.Config) -> None:
    global _group
    if not os.environ.get("HETEROTRAIN_CPU_LOG") or not CPUACCT.is_dir():
        return
    group = CPUACCT / f"heterotrain-suite-{os.getpid()}-{_worker(config)}"
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(str(os.getpid()))
    except OSError:
        return
    _group = group


def _usage() -> float:
    assert _group is not None
    return int((_group / "cpuacct.usage").read_text()) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if _group is None:
        yield
        return
    cpu, wall = _usage(), time.monotonic()
    yield
    row = {
        "test": item.nodeid,
        "worker": _worker(item.config),
        "cpu_s": round(_usage() - cpu, 3),
        "wall_s": round(time.monotonic() - wall, 3),
    }
    with open(os.environ["HETEROTRAIN_CPU_LOG"], "a") as sink:
        sink.write(json.dumps(row) + "\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _group is None:
        return
    try:  # back to the root group; the group goes once the last process in it has ended
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        _group.rmdir()
    except OSError:
        pass
