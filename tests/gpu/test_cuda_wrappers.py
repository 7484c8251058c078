"""The framework wrappers on the GPU: a PyTorch Lightning script under `HeteroStrategy` and a Hugging
Face `transformers` model through HeteroModel train on CUDA when the worker is given a GPU, and learn
what they learn on the CPU (the thresholds of tests/runtime/test_lightning.py and test_byos_hf.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from tests.gpu.one_worker import run_on_the_gpu

import hetero_runtime.examples.hf_causal_lm as hf_example
import hetero_runtime.examples.lightning_digits as lightning_example

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


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
