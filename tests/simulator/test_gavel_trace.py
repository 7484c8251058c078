"""Gavel's Philly-derived trace as a heterotrain trace: the converter against hand-computed rows, the
committed CSV against a fresh conversion, and a short prefix of the real trace simulated with --bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hetero_operator.cli.simulate import simulate as simulate_command
from hetero_operator.simulator.gavel_trace import (
    GavelTraceError,
    isolated_throughputs,
    load_throughputs,
    main,
    model_of,
    parse_line,
    parse_trace,
    workload_key,
)
from hetero_operator.simulator.gavel_trace import convert as convert_trace
from hetero_operator.simulator.trace import load_trace, trace_from_csv, trace_to_csv

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
GAVEL = EXAMPLES / "traces" / "gavel"
RAW = GAVEL / "philly-0e4a51-seed0.trace"
CONVERTED = GAVEL / "philly-0e4a51-seed0.csv"
THROUGHPUTS = GAVEL / "throughputs.json"

# Gavel's 7-field layout: job_type, command, num_steps_arg, needs_data_dir, total_steps, arrival, GPUs.
LINES = "\n".join(
    [
        "ResNet-18 (batch size 32)\tpython3 main.py --batch_size 32\t--num_steps\t1\t1000\t6.000000\t2",
        "A3C\tpython3 main.py\t--max-steps\t0\t500\t7.000000\t1",
        "Recommendation (batch size 512)\tpython3 train.py\t-n\t1\t640\t9.500000\t4",
    ]
)
# Made-up figures (iterations/s), simple enough to check by hand.
TABLE = {
    "v100": {"ResNet-18 (batch size 32)": {1: 25.0, 2: 40.0}, "Recommendation (batch size 512)": {1: 8.0}},
    "k80": {"ResNet-18 (batch size 32)": {1: 5.0}},
}


def test_rows_by_hand() -> None:
    conversion = convert_trace(parse_trace(LINES), TABLE)
    rows = [r.model_dump() for r in conversion.rows]
    assert rows == [
        {
            "job_id": "gavel-00000",
            "arrival_s": 6.0,
            "model": "resnet18",
            "gpus_min": 2,
            "gpus_max": 2,
            "duration_s": 25.0,  # 1000 steps at 40 steps/s on two V100s
            "priority": 0,
            "gpu_classes": (),
            "tenant": "default",
            "workload": "gavel-resnet-18-bs32",
        },
        {
            "job_id": "gavel-00002",
            "arrival_s": 9.5,
            "model": "recommendation",
            "gpus_min": 4,
            "gpus_max": 4,
            "duration_s": 20.0,  # 640 steps at 4 x 8 steps/s: measured on one GPU only, scaled
            "priority": 0,
            "gpu_classes": (),
            "tenant": "default",
            "workload": "gavel-recommendation-bs512",
        },
    ]
    assert conversion.dropped == [(1, "no heterotrain model for 'A3C'")]
    assert conversion.approximated == [2]
    assert [r.job_id for r in convert_trace(parse_trace(LINES), TABLE, limit=1).rows] == ["gavel-00000"]


def test_current_layout_and_bad_lines() -> None:
    # The 10-field layout: job_type, command, working_directory, num_steps_arg, needs_data_dir,
    # total_steps, scale_factor, priority_weight, SLO, arrival_time.
    job = parse_line(
        "LM (batch size 80)\tpython3 main.py\tlanguage_modeling\t--steps\t1\t300\t8\t1\t-1.000000\t42", 3
    )
    assert (job.line, job.job_type, job.total_steps, job.scale_factor, job.arrival_s) == (
        3,
        "LM (batch size 80)",
        300,
        8,
        42.0,
    )
    assert model_of(job.job_type) == "lm" and workload_key("CycleGAN") == "gavel-cyclegan"
    with pytest.raises(GavelTraceError, match="line 4: expected 7 or 10"):
        parse_line("LM (batch size 80)\t300\t8", 4)
    with pytest.raises(GavelTraceError, match="line 0"):
        parse_line("LM (batch size 80)\tc\t--steps\t1\tmany\t0\t1", 0)
    with pytest.raises(GavelTraceError, match="no V100 figure"):
        convert_trace(parse_trace("CycleGAN\tc\t--steps\t1\t10\t0\t1"), {"v100": {}})


def test_isolated_entries_of_gavels_file() -> None:
    raw = {
        worker: {
            "('LM (batch size 80)', 1)": {"null": 3.0, "('A3C', 1)": [1.0, 2.0]},
            "('LM (batch size 80)', 2)": {"null": 0.0},  # did not run: left out
        }
        for worker in ("v100", "p100", "k80")
    }
    assert isolated_throughputs(raw)["p100"] == {"LM (batch size 80)": {1: 3.0}}


def test_committed_real_trace() -> None:
    """The committed CSV loads, equals a fresh conversion of the committed raw file, and its first
    job's duration is Gavel's steps over Gavel's V100 figure."""
    rows = load_trace(CONVERTED, ("v100", "p100", "k80"))
    fresh = convert_trace(parse_trace(RAW.read_text()), load_throughputs(THROUGHPUTS))
    assert CONVERTED.read_text() == trace_to_csv(fresh.rows)
    assert rows == trace_from_csv(trace_to_csv(fresh.rows))
    raw_lines = RAW.read_text().splitlines()
    assert len(rows) == len(raw_lines) - len(fresh.dropped) == 1139
    assert all(reason == "no heterotrain model for 'A3C'" for _, reason in fresh.dropped)
    first = next(r for r in rows if r.job_id == "gavel-00000")
    # Line 0: Transformer (batch size 128), 95121 steps, 1 GPU; V100 alone: 5.44610521981264 it/s.
    assert raw_lines[0].split("\t")[4] == "95121"
    assert first.duration_s == pytest.approx(95121 / 5.44610521981264, abs=1e-3)
    assert (first.model, first.gpus_min, first.workload) == ("transformer", 1, "gavel-transformer-bs128")


def test_command_line(tmp_path: Path) -> None:
    subset = tmp_path / "subset.json"
    out = tmp_path / "out.csv"
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({w: {"('CycleGAN', 1)": {"null": 2.0}} for w in ("v100", "p100", "k80")}))
    assert main(["--extract", str(raw), str(subset), "--source", "test"]) == 0
    assert json.loads(subset.read_text())["steps_per_s"]["k80"] == {"CycleGAN": {"1": 2.0}}
    trace = tmp_path / "in.trace"
    trace.write_text("CycleGAN\tc\t--steps\t1\t10\t0\t1\nCycleGAN\tc\t--steps\t1\t30\t5\t1\n")
    assert main([str(trace), str(subset), str(out), "--jobs", "1"]) == 0
    assert [(r.job_id, r.duration_s) for r in load_trace(out)] == [("gavel-00000", 5.0)]


def test_prefix_of_real_trace_simulates_above_bound(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix.csv"
    prefix.write_text("\n".join(CONVERTED.read_text().splitlines()[:11]) + "\n")  # header and 10 jobs
    app = typer.Typer()
    app.command()(simulate_command)
    args = ["--cluster", str(EXAMPLES / "cluster-gavel-108.yaml"), "--trace", str(prefix)]
    result = CliRunner().invoke(app, [*args, "--policy", "all", "--bound"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    bound = document["lower_bound"]["avg_jct"]
    assert bound > 0 and len(document["results"]) == 5
    for summary in document["results"]:
        assert summary["jobs"] == 10
        assert summary["avg_jct"] >= bound * (1 - 1e-9), summary
