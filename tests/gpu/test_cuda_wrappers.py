"""The framework wrappers on the GPU: a PyTorch Lightning script under `HeteroStrategy` and a Hugging
Face `transformers` model through HeteroModel train on CUDA when the worker is given a GPU, and learn
what they learn on the CPU (the thresholds of tests/runtime/test_lightning.py and test_byos_hf.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

import hetero_runtime.examples.hf_causal_lm as hf_example
import hetero_runtime.examples.lightning_digits as lightning_example
from hetero_operator.plan import Strategy
from hetero_runtime.local import LocalJob, LocalJobSpec, initial_plan

pytestmark = pytest.mark.timeout(300)


def run_on_the_gpu(tmp_path: Path, name: str, script: str, args: list[str], batch: int) -> dict[str, Any]:
    """The script as one worker's command, on the GPU the worker is given."""
    out = tmp_path / "out.json"
    spec = LocalJobSpec(
        target=name,
        speeds=[1.0],
        work_dir=tmp_path,
        plan=initial_plan(Strategy.DATA, [1.0], batch),
        max_restarts=0,
        extra_env={"HETEROTRAIN_DEVICE": "auto"},
        command=[sys.executable, script, *args, "--out", str(out)],
    )
    job = LocalJob(spec)
    job.start()
    try:
        code = job.wait(240)
    finally:
        job.stop()
    assert code == 0, spec.log_file(0).read_text()[-3000:]
    return dict(json.loads(out.read_text()))


def test_a_lightning_script_trains_on_the_gpu(tmp_path: Path) -> None:
    script = str(Path(lightning_example.__file__))
    metrics = run_on_the_gpu(tmp_path, "lightning_digits", script, ["--epochs", "4"], 64)
    assert metrics["device"] == "cuda" and metrics["world_size"] == 1
    assert metrics["accuracy"] >= 0.9, metrics


def test_a_transformers_model_trains_on_the_gpu(tmp_path: Path) -> None:
    script = str(Path(hf_example.__file__))
    args = ["--epochs", "8", "--batch-size", "32", "--sentences", "800"]
    metrics = run_on_the_gpu(tmp_path, "hf_causal_lm", script, args, 32)
    assert metrics["device"] == "cuda" and metrics["world_size"] == 1
    uniform = math.log(metrics["vocabulary"])
    assert metrics["initial_loss"] > 0.9 * uniform, metrics
    assert metrics["held_out_loss"] < 0.45 * uniform, metrics
