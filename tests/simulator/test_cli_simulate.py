"""`heterotrain simulate`: JSON on stdout, PNGs in --out, exit 2 naming the bad field."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from hetero_operator.cli.simulate import simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command()(simulate)
    return app


def test_simulates_the_example_trace_and_writes_plots(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        _app(),
        [
            "--cluster",
            str(EXAMPLES / "cluster-64.yaml"),
            "--trace",
            str(EXAMPLES / "trace-64.csv"),
            "--policy",
            "all",
            "--out",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [r["policy"] for r in document["results"]] == [
        "fifo",
        "fifo-backfill",
        "greedy-fastest",
        "gavel",
        "heterotrain",
    ]
    assert all(r["jobs"] == 30 for r in document["results"])
    assert (tmp_path / "jct_cdf.png").stat().st_size > 0
    assert (tmp_path / "utilisation_gavel.png").stat().st_size > 0


def test_generates_a_trace_from_a_seed_when_none_is_given() -> None:
    args = [
        "--cluster",
        str(EXAMPLES / "cluster-64.yaml"),
        "--jobs",
        "12",
        "--seed",
        "4",
    ]
    first = json.loads(CliRunner().invoke(_app(), args).stdout)
    second = json.loads(CliRunner().invoke(_app(), args).stdout)
    assert first["results"][0]["avg_jct"] == second["results"][0]["avg_jct"]
    assert first["results"][0]["jobs"] == 12


def test_unknown_policy_exits_2_naming_the_field() -> None:
    result = CliRunner().invoke(_app(), ["--cluster", str(EXAMPLES / "cluster-64.yaml"), "--policy", "sjf"])
    assert result.exit_code == 2
    assert "policy: unknown policy 'sjf'" in result.output


def test_bad_cluster_file_exits_2_naming_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("classes: []\nnodeGroups: []\n")
    result = CliRunner().invoke(_app(), ["--cluster", str(bad)])
    assert result.exit_code == 2
    assert "classes:" in result.output


def test_knowledge_is_measured_by_default_and_the_oracle_on_request() -> None:
    args = ["--cluster", str(EXAMPLES / "cluster-64.yaml"), "--jobs", "12", "--seed", "4"]
    measured = json.loads(CliRunner().invoke(_app(), args).stdout)
    oracle = json.loads(CliRunner().invoke(_app(), [*args, "--knowledge", "oracle"]).stdout)
    assert (measured["knowledge"], oracle["knowledge"]) == ("measured", "oracle")
    refused = CliRunner().invoke(_app(), [*args, "--knowledge", "psychic"])
    assert refused.exit_code == 2
