"""Mixed precision per GPU class: `spec.precision` auto | fp32 | bf16 | fp16, resolved by each worker
from its own device (an A100 trains in bf16, a V100 or T4, which have no bf16, in fp16 with loss
scaling, a CPU in fp32).

Loss scaling (fp16) is offered with the `data` strategy, whose steps are synchronous: its weighted
all-reduce sums the scaled gradients, so every rank unscales the same buffer with the same scale and
finds the same overflow, and a step skipped for overflow is skipped on every rank. The local-SGD
strategies step each rank on its own and DreamDDP updates every layer inside backward, before a loss
scaler could see the whole gradient: they run in bf16 or fp32 (`auto` picks fp32 on GPUs without bf16).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from hetero_operator.plan import PRECISION_ENV, Precision, Strategy

log = logging.getLogger(__name__)

_DTYPES = {Precision.BF16: torch.bfloat16, Precision.FP16: torch.float16}
BF16_MIN_COMPUTE_CAPABILITY = 8  # Ampere: A100, A10, L4, H100 (a V100 is 7.0, a T4 7.5)


class PrecisionError(ValueError):
    """The requested precision cannot run on this worker's device or strategy."""


def device_has_bf16(device: torch.device) -> bool:
    """bf16 in hardware: any CPU (autocast supports it), a GPU from compute capability 8.0. Not
    `torch.cuda.is_bf16_supported()`, which also answers yes for a slow emulation on older GPUs."""
    if device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device)[0] >= BF16_MIN_COMPUTE_CAPABILITY


def resolve_precision(
    requested: Precision, device_type: str, has_bf16: bool, strategy: Strategy
) -> Precision:
    """The precision one worker trains in; raises PrecisionError naming the setting and the fix."""
    if requested is Precision.AUTO:
        if device_type != "cuda":
            return Precision.FP32
        if has_bf16:
            return Precision.BF16
        return Precision.FP16 if strategy is Strategy.DATA else Precision.FP32
    if requested is Precision.BF16 and not has_bf16:
        raise PrecisionError(
            f"{PRECISION_ENV}=bf16 (spec.precision): this GPU has no bf16 (compute capability < 8.0): "
            "use fp16, fp32 or auto"
        )
    if requested is Precision.FP16 and strategy is not Strategy.DATA:
        raise PrecisionError(
            f"{PRECISION_ENV}=fp16 (spec.precision) needs loss scaling, which the {strategy.value} strategy "
            "does not synchronise: use bf16, fp32 or auto, or the data strategy"
        )
    return requested


class MixedPrecision:
    """Autocast for the forward pass and, in fp16, a loss scaler whose steps every rank takes alike."""

    def __init__(self, precision: Precision, device: torch.device) -> None:
        if precision is Precision.AUTO:
            raise ValueError("resolve `auto` with resolve_precision() first")
        self.precision = precision
        self.device_type = device.type
        self.dtype = _DTYPES.get(precision)
        self.scaler = torch.amp.GradScaler(device.type) if precision is Precision.FP16 else None
        self.skipped_steps = 0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device_type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    @property
    def loss_scale(self) -> float:
        """The factor the gradients carry until the step unscales them (1 without a scaler)."""
        return float(self.scaler.get_scale()) if self.scaler is not None else 1.0

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Unscale, step unless a gradient overflowed, adapt the scale; True when the step was taken.

        The scaler halves its scale exactly when it skipped, so comparing the scale before and after
        tells a skip without reaching into the scaler's internals."""
        if self.scaler is None:
            optimizer.step()
            return True
        before = self.scaler.get_scale()
        self.scaler.step(optimizer)
        self.scaler.update()
        taken = self.scaler.get_scale() >= before
        if not taken:
            self.skipped_steps += 1
            log.info("fp16: a gradient overflowed at loss scale %g; step skipped", before)
        return taken

    def state_dict(self) -> dict[str, Any]:
        return {"precision": self.precision.value, "scaler": self.scaler.state_dict() if self.scaler else {}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("precision") == self.precision.value and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def mixed_precision(requested: Precision, device: torch.device, strategy: Strategy) -> MixedPrecision:
    chosen = resolve_precision(requested, device.type, device_has_bf16(device), strategy)
    if requested is Precision.AUTO:
        log.info("precision auto: %s on %s", chosen.value, device)
    return MixedPrecision(chosen, device)
