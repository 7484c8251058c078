"""`heterotrain plan KIND FILE|-`: JSON in, JSON out, exit code 2 on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from hetero_operator.cli import build_app

runner = CliRunner()
app = build_app()

BATCH: dict[str, Any] = {
    "global_batch": 150,
    "gamma": 0.25,
    "t_o": 40,
    "t_u": 5,
    "workers": [
        {"name": "fast", "q": 0.2, "s": 3, "k": 0.4, "m": 5, "min_batch": 0},
        {"name": "mid", "q": 0.4, "s": 4, "k": 0.8, "m": 6, "min_batch": 0},
        {"name": "slow", "q": 0.7, "s": 5, "k": 1.4, "m": 30, "min_batch": 0},
    ],
}
PIPELINE: dict[str, Any] = {
    "layers": [
        {"time": t, "activation_mb": a, "param_mb": p, "stash_mb": s}
        for t, a, p, s in zip(
            [12, 16, 16, 14, 10, 8, 4, 2],
            [40, 40, 20, 20, 10, 5, 2, 1],
            [5, 10, 40, 80, 150, 300, 1000, 100],
            [1500, 1200, 300, 300, 200, 200, 40, 10],
            strict=True,
        )
    ],
    "gpus": [
        {"name": "X", "speed": 1.0, "memory_mb": 12000, "node": "A"},
        {"name": "Y", "speed": 0.5, "memory_mb": 8000, "node": "A"},
        {"name": "Z", "speed": 0.25, "memory_mb": 6000, "node": "B"},
    ],
    "nm": 4,
    "links": {
        "same_node": {"latency_ms": 0, "mb_per_ms": 9.45},
        "cross_node": {"latency_ms": 0.5, "mb_per_ms": 5},
    },
    "fixed_order": False,
}


def plan(kind: str, payload: dict[str, Any] | str) -> tuple[int, str, str]:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    result = runner.invoke(app, ["plan", kind, "-"], input=text)
    return result.exit_code, result.stdout, result.stderr


def test_batch_from_stdin() -> None:
    code, out, _ = plan("batch", BATCH)
    assert code == 0
    answer = json.loads(out)
    assert answer["local_batches"] == [90, 43, 17]
    assert answer["iteration_time"] == pytest.approx(76.3)


def test_batch_from_file(tmp_path: Path) -> None:
    path = tmp_path / "req.json"
    path.write_text(json.dumps(BATCH))
    result = runner.invoke(app, ["plan", "batch", str(path)])
    assert result.exit_code == 0
    assert json.loads(result.stdout)["local_batches"] == [90, 43, 17]


def test_pipeline() -> None:
    code, out, _ = plan("pipeline", PIPELINE)
    assert code == 0
    answer = json.loads(out)
    assert answer["order"] == ["Y", "X", "Z"]
    assert answer["stages"] == [[0], [1, 2, 3, 4], [5, 6, 7]]
    assert answer["bottleneck_ms"] == pytest.approx(62.733, abs=1e-3)
    assert set(answer) == {"order", "stages", "stage_ms", "bottleneck_ms"}


def test_pipeline_that_cannot_fit_exits_2_naming_memory() -> None:
    small = {**PIPELINE, "gpus": [{**g, "memory_mb": 3000} for g in PIPELINE["gpus"]]}
    code, out, err = plan("pipeline", small)
    assert code == 2 and out == ""
    assert "memory_mb" in err


def test_dreamddp_esync_sesgd_vw() -> None:
    code, out, _ = plan(
        "dreamddp",
        {"H": 3, "forward_ms": 2, "backward_ms": [3, 1, 4, 2, 2, 3], "comm_ms": [2, 4, 6, 3, 4, 3]},
    )
    assert code == 0
    answer = json.loads(out)
    assert answer["phases"] == [[0, 1, 2], [3], [4, 5]] and answer["exposed_ms"] == pytest.approx(4.0)
    code, out, _ = plan("esync", {"step_ms": [100, 250, 500], "epsilon_ms": 1})
    assert (code, json.loads(out)) == (0, {"local_steps": [4, 1, 1]})
    code, out, _ = plan("sesgd", {"n": 8, "k": 2, "seed": 42, "steps": 1})
    assert (code, json.loads(out)) == (0, {"groups": [[[3, 1, 6, 2], [4, 0, 7, 5]]]})
    nodes = [
        {"name": f"n{i}", "gpu_class": c, "gpus": 4, "speed": s, "memory_gb": m}
        for i, (c, s, m) in enumerate([("V", 1.0, 12), ("R", 0.85, 24), ("G", 0.45, 6), ("Q", 0.35, 8)])
    ]
    code, out, _ = plan("vw", {"nodes": nodes, "k": 4, "policy": "HD"})
    answer = json.loads(out)
    assert code == 0 and answer["policy"] == "HD"
    assert [s["node"] for s in answer["virtual_workers"][0]] == ["n0", "n0", "n3", "n3"]


@pytest.mark.parametrize(
    ("kind", "payload", "field"),
    [
        ("batch", {**BATCH, "t_o": -1}, "t_o"),
        ("batch", {**BATCH, "workers": []}, "workers"),
        (
            "batch",
            {**BATCH, "global_batch": 2, "workers": [{**w, "min_batch": 1} for w in BATCH["workers"]]},
            "global_batch",
        ),
        ("batch", {**BATCH, "colour": "red"}, "colour"),
        ("batch", {**BATCH, "workers": [{**BATCH["workers"][0], "q": -0.2}]}, "workers.0.q"),
        ("pipeline", {**PIPELINE, "layers": [{**PIPELINE["layers"][0], "time": -3}]}, "layers.0.time"),
        ("dreamddp", {"H": 2, "forward_ms": 0, "backward_ms": [1, 2], "comm_ms": [1]}, "comm_ms"),
        ("esync", {"step_ms": [100, -1], "epsilon_ms": 1}, "step_ms.1"),
        ("sesgd", {"n": 8, "k": 3, "seed": 1, "steps": 1}, "k"),
        ("vw", {"nodes": [], "k": 4, "policy": "NP"}, "nodes"),
        (
            "vw",
            {
                "nodes": [{"name": "a", "gpu_class": "A", "gpus": 2, "speed": 1, "memory_gb": 8}],
                "k": 4,
                "policy": "XX",
            },
            "policy",
        ),
    ],
)
def test_invalid_input_exits_2_naming_the_field(kind: str, payload: dict[str, Any], field: str) -> None:
    code, out, err = plan(kind, payload)
    assert code == 2
    assert out == ""
    assert field in err


def test_malformed_json_exits_2() -> None:
    code, _, err = plan("batch", "{not json")
    assert code == 2 and "json" in err.lower()


def test_console_script_exit_code() -> None:
    bad = json.dumps({**BATCH, "workers": []})
    proc = subprocess.run(
        [sys.executable, "-m", "hetero_operator", "plan", "batch", "-"],
        input=bad,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "workers" in proc.stderr
