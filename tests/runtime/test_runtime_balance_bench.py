"""The runtime balance benchmark's report helpers: table rows, the BENCHMARKS.md update, contention."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "runtime_balance.py"

MARKDOWN = """# Benchmarks

## Runtime

Intro.

| Mode | Simulated speeds | a | b |
|---|---|---|---|
| dilated x4 | old | 1 | 2 |
| undilated | old | 3 | 4 |

Notes.

### Slow link

| Strategy | Epoch s |
|---|---|
| data | 0.5 |

## Scheduling policies
"""


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("runtime_balance_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def phase(step_ms: float, overrun_ms: list[float]) -> dict[str, Any]:
    return {
        "local_batches": [585, 293, 146],
        "samples_per_s": 1024 / step_ms * 1e3,
        "worker_compute_ms": [step_ms - 5] * 3,
        "slowest_compute_per_step_ms": step_ms - 3,
        "worker_step_ms": [step_ms] * 3,
        "worker_overrun_ms": overrun_ms,
    }


def result(dilation: float, overrun_ms: list[float]) -> dict[str, Any]:
    return {
        "time_dilation": dilation,
        "simulated_speeds": [1 / dilation, 0.5 / dilation, 0.25 / dilation],
        "even": phase(500.0, [0.0, 0.0, 0.0]),
        "data": phase(250.0, overrun_ms),
        "rounds": [{}, {}],
        "speedup_vs_even": 2.0,
        "efficiency": 0.98,
        "even_efficiency": 0.5,
        "host_load_1min": [0.5, 0.7],
    }


def test_write_replaces_only_the_row_of_the_same_mode(bench: ModuleType) -> None:
    row = bench.table_row(result(4.0, [0.0, 0.0, 0.0]))
    assert row.startswith("| dilated x4 | 0.25, 0.125, 0.0625 | 2048 | 4096 | 2.00 | 0.980 |")
    updated = bench.with_row(MARKDOWN, row)
    assert row in updated and "| dilated x4 | old |" not in updated
    assert updated.replace(row, "| dilated x4 | old | 1 | 2 |") == MARKDOWN


def test_write_adds_a_new_mode_after_the_runtime_table(bench: ModuleType) -> None:
    row = bench.table_row(result(8.0, [0.0, 0.0, 0.0]))
    updated = bench.with_row(MARKDOWN, row)
    assert "| undilated | old | 3 | 4 |\n" + row + "\n\nNotes." in updated
    assert updated.count("| data | 0.5 |") == 1  # the slow-link table is untouched


def test_contention_share_is_the_worst_overrun_against_its_step(bench: ModuleType) -> None:
    assert bench.contention_share(result(4.0, [0.0, 0.0, 0.0])) == 0.0
    assert bench.contention_share(result(4.0, [25.0, 5.0, 0.0])) == pytest.approx(0.1)


def test_simulated_gpus_share_a_core_while_their_load_fits_in_half_of_it(bench: ModuleType) -> None:
    # Dilated x4: 0.25 + 0.125 + 0.0625 of a core fit in one.
    assert bench.core_of_each_worker([0.25, 0.125, 0.0625], [0, 1]) == [0, 0, 0]
    assert bench.core_of_each_worker([0.0625, 0.25, 0.125], [2, 5]) == [2, 2, 2]
    # Undilated: the fastest fills a core of its own, the two slower share the other.
    assert bench.core_of_each_worker([1.0, 0.5, 0.25], [0, 1]) == [0, 1, 1]
    assert bench.core_of_each_worker([1.0, 0.5, 0.25], [0, 1, 2, 3]) == [0, 1, 2]
    assert bench.core_of_each_worker([0.4, 0.4, 0.4], [0, 1]) == [0, 1, 0]
    assert bench.core_of_each_worker([1.0, 0.5], [3]) == [3, 3]
