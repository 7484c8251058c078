"""What each layer of a pipelined model costs on this worker: the per-sample seconds of its forward
and backward, timed layer by layer, on inputs the layers before it made. The operator cuts HetPipe's
stages from these (the planner's partition of measured costs), not from a guess of the user's.

A simulated slower GPU (speed s < 1) runs every layer 1/s times as long as the simulated base device:
its costs are the base device's divided by s, as the pipeline will see them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from hetero_runtime.strategies.base import LossFn, preserved_state, synchronize

SAMPLE_SECONDS = 0.002  # each timing runs the layer often enough to last this long: clock and call noise
TIMINGS = 7  # the fastest of these counts: a busy host only ever adds time to a run


def fastest_seconds(run: Callable[[], None]) -> float:
    """The fastest of TIMINGS timings of `run`, each of enough calls to last SAMPLE_SECONDS."""
    run()  # warm-up (allocations, lazy initialisation)
    started = time.perf_counter()
    run()
    calls = max(1, int(SAMPLE_SECONDS / max(time.perf_counter() - started, 1e-9)))
    best = float("inf")
    for _ in range(TIMINGS):
        started = time.perf_counter()
        for _ in range(calls):
            run()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def measure_layer_costs(
    layers: nn.Sequential, inputs: torch.Tensor, targets: Any, loss_fn: LossFn
) -> list[float]:
    """Per-sample seconds of each layer's forward and backward (the loss's too, on the last layer) on
    the device the layers are on; the model is left exactly as it was."""
    device = inputs.device
    samples = len(targets)
    costs = []
    with preserved_state(layers):
        x = inputs
        for index, layer in enumerate(layers):
            last = index == len(layers) - 1
            # The first stage gets no input gradient in the pipeline; every later one sends one back.
            x_in = x.detach().requires_grad_(index > 0 and x.is_floating_point())

            def forward_backward(
                layer: nn.Module = layer, x_in: torch.Tensor = x_in, last: bool = last
            ) -> None:
                out = layer(x_in)
                if last:
                    loss_fn(out, targets).backward()
                elif out.requires_grad:
                    out.backward(torch.ones_like(out))
                synchronize(device)

            costs.append(fastest_seconds(forward_backward) / samples)
            with torch.no_grad():
                x = layer(x)
    return costs


def base_device_factor(own: Sequence[float], base: Sequence[float]) -> float:
    """How many times as long the base device takes as this rank's own over the same layers (1 when
    they were too fast to time)."""
    mine = sum(own)
    return sum(base) / mine if mine > 0 else 1.0
