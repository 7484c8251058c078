"""What every strategy shares: the worker context, the strategy protocol and small tensor helpers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

from hetero_operator.plan import Plan
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.simulate import SpeedSimulator

LossFn = Callable[[Any, Any], torch.Tensor]
EvaluateFn = Callable[[nn.Module], dict[str, float]]


@dataclass
class WorkerContext:
    env: WorkerEnv
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Dataset[Any]
    loss_fn: LossFn
    metrics: WorkerMetrics
    simulator: SpeedSimulator
    sampler: UnevenBatchSampler
    base_learning_rates: list[float] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size


@dataclass
class EpochStats:
    """What one rank measured in one epoch."""

    loss: float  # mean training loss over the epoch (global where the strategy syncs it)
    samples: int  # samples this rank trained on
    steps: int
    compute_seconds: float  # sum of (stretched) compute time
    comm_seconds: float
    wall_seconds: float
    extra: dict[str, float] = field(default_factory=dict)


class TrainingStrategy(Protocol):
    name: str

    def start(self, plan: Plan) -> None:
        """Called once after the model state is final on every rank (fresh or resumed)."""

    def apply_plan(self, plan: Plan) -> None:
        """Take a new plan at an epoch boundary."""

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        """Train from `position` to the end of its epoch; replicas are consistent on return."""

    def evaluation_model(self) -> nn.Module | None:
        """The full model to evaluate and checkpoint on this rank, or None if this rank has none."""

    def state_dict(self) -> dict[str, Any]:
        """Strategy state beyond the model and the user's optimizer."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Release helpers (threads, services) when training ends or fails."""


def fetch_batch(dataset: Dataset[Any], indices: np.ndarray) -> Any:
    """The samples at `indices`, collated; tensor datasets are sliced without a Python loop."""
    if isinstance(dataset, TensorDataset):
        index = torch.as_tensor(indices, dtype=torch.long)
        return tuple(tensor[index] for tensor in dataset.tensors)
    return default_collate([dataset[int(i)] for i in indices])


def forward_loss(model: nn.Module, loss_fn: LossFn, batch: Any) -> torch.Tensor:
    """Mean loss of a (inputs, targets) batch, moved to the model's device."""
    inputs, targets = batch
    device = next(model.parameters()).device
    return loss_fn(model(inputs.to(device)), targets.to(device))


def apply_learning_rate_scale(ctx: WorkerContext, scale: float) -> None:
    if not ctx.base_learning_rates:
        ctx.base_learning_rates = [float(group["lr"]) for group in ctx.optimizer.param_groups]
    for group, base in zip(ctx.optimizer.param_groups, ctx.base_learning_rates, strict=True):
        group["lr"] = base * scale


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def broadcast_model(model: nn.Module, src: int = 0, group: Any = None) -> None:
    """Make every rank start from `src`'s parameters and buffers."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor.data, src=src, group=group)


def average_model(model: nn.Module, world_size: int) -> None:
    """Replace every rank's parameters and float buffers by their mean over all ranks."""
    tensors = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    if not tensors or world_size == 1:
        return
    with torch.no_grad():
        flat = torch.cat([t.data.reshape(-1) for t in tensors])
        dist.all_reduce(flat)
        flat.div_(world_size)
        copy_from_flat(tensors, flat)


def flat_gradients(params: Sequence[nn.Parameter]) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def copy_from_flat(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.data.copy_(flat[offset : offset + count].view_as(tensor))
        offset += count


def set_gradients_from_flat(params: Sequence[nn.Parameter], flat: torch.Tensor) -> None:
    offset = 0
    for param in params:
        count = param.numel()
        grad = flat[offset : offset + count].view_as(param)
        if param.grad is None:
            param.grad = grad.clone()
        else:
            param.grad.copy_(grad)
        offset += count
