"""Batches copied to the GPU one step ahead (on a side stream, while the step before computes) arrive
whole and in order, and a script's HeteroDataLoader trains through them on the device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.gpu.one_worker import run_on_the_gpu

import hetero_runtime.examples.ddp_digits_hetero as ported_example
from hetero_runtime.device import to_device
from hetero_runtime.prefetch import staged

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]
GPU = torch.device("cuda:0")


def test_staged_batches_arrive_whole_and_in_order_while_the_gpu_computes() -> None:
    sources = [(torch.full((2048, 2048), float(i)), torch.tensor([i])) for i in range(12)]
    seen = []
    for x, label in staged(sources, lambda batch: to_device(batch, GPU, pin=True), GPU):
        assert x.is_cuda and label.is_cuda
        # Long enough on the compute stream that the next copy runs beside it.
        product = x @ x
        seen.append((float(x.mean()), int(label), float(product[0, 0])))
        del x, product  # freed memory must not be handed to the next copy while still in use
    assert seen == [(float(i), i, float(i) * float(i) * 2048) for i in range(12)]


def test_an_own_script_trains_on_the_gpu_through_the_loader(tmp_path: Path) -> None:
    script = str(Path(ported_example.__file__))
    metrics = run_on_the_gpu(tmp_path, "ddp_digits_hetero", script, ["--epochs", "3"], 64)
    assert metrics["world_size"] == 1 and metrics["accuracy"] >= 0.9
