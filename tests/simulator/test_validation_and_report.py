"""The throughput model against a recorded runtime benchmark run; summaries and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sim_cases import small_trace, three_class_cluster

from hetero_operator.simulator.engine import simulate
from hetero_operator.simulator.policies import make_policy
from hetero_operator.simulator.report import summarize, write_plots
from hetero_operator.simulator.validation import (
    TOLERANCE,
    compare_runtime_benchmark,
    predict_phase,
)

RECORDED = Path(__file__).parent / "data" / "runtime_balance_recorded.json"


def test_predicted_throughput_is_within_ten_percent_of_the_recorded_runtime_run() -> None:
    # A run of bench/runtime_balance.py (three workers at speeds 1, 0.5, 0.25), recorded as JSON.
    result = json.loads(RECORDED.read_text())
    comparisons = compare_runtime_benchmark(result)
    assert [c.phase for c in comparisons] == ["even", "data"]
    for comparison in comparisons:
        assert comparison.relative_error <= TOLERANCE, comparison


def test_prediction_is_set_by_the_slowest_worker_plus_communication() -> None:
    phase = {
        "local_batches": [100, 100],
        "worker_compute_ms": [50.0, 200.0],
        "worker_comm_ms": [160.0, 10.0],
    }
    assert predict_phase(phase) == pytest.approx(200 * 1000 / (200 + 10))
    # A better split (the slow worker gets less) is predicted faster, at the same per-sample costs.
    balanced = {
        "local_batches": [160, 40],
        "worker_compute_ms": [80.0, 80.0],
        "worker_comm_ms": [10.0, 10.0],
    }
    assert predict_phase(balanced) > predict_phase(phase)


def test_a_result_without_the_phase_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^data: phase missing"):
        compare_runtime_benchmark({"even": {}}, phases=("data",))


def test_summary_and_plots(tmp_path: Path) -> None:
    results = [
        simulate(three_class_cluster(), small_trace(jobs=15), make_policy(p)) for p in ("fifo", "heterotrain")
    ]
    summary = summarize(results[1])
    assert summary["jobs"] == 15
    assert summary["p99_jct"] >= summary["p50_jct"] > 0
    assert summary["avg_jct"] >= summary["avg_queueing_delay"] >= 0
    assert 0 < summary["utilisation"] <= 1
    assert set(summary["utilisation_per_class"]) == {"v100", "p100", "k80"}
    paths = write_plots(results, tmp_path)
    assert [p.name for p in paths] == [
        "jct_cdf.png",
        "utilisation_fifo.png",
        "utilisation_heterotrain.png",
    ]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
