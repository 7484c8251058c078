"""What every strategy shares: the worker context, the strategy protocol and small tensor helpers."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset, TensorDataset, default_collate

from hetero_operator.plan import Plan, Precision
from hetero_runtime.device import PlacedRank, Placement, to_device
from hetero_runtime.divergence import DivergenceGuard
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.precision import MixedPrecision
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.simulate import SpeedSimulator, per_sample_seconds
from hetero_runtime.stopping import StopRequests

LossFn = Callable[[Any, Any], torch.Tensor]
EvaluateFn = Callable[[nn.Module], dict[str, float]]


@dataclass
class WorkerContext(PlacedRank):
    env: WorkerEnv
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Dataset[Any]
    loss_fn: LossFn
    metrics: WorkerMetrics
    simulator: SpeedSimulator
    sampler: UnevenBatchSampler
    placement: Placement = field(default_factory=lambda: Placement(torch.device("cpu"), "gloo"))
    amp: MixedPrecision = field(default_factory=lambda: MixedPrecision(Precision.FP32, torch.device("cpu")))
    stop: StopRequests = field(default_factory=StopRequests)
    costs: dict[str, float] = field(default_factory=dict)
    """Per-sample seconds of each compute segment on the simulated base device (calibrated solo)."""
    base_learning_rates: list[float] = field(default_factory=list)
    guard: DivergenceGuard | None = None
    """Checks that the replicas agree and stay finite (the Trainer sets it)."""

    def batch(self, indices: np.ndarray) -> Any:
        """The samples at `indices`, collated and on this worker's device."""
        return to_device(fetch_batch(self.dataset, indices), self.device, self.placement.pin_memory)

    def full_speed_seconds(self, segment: str, samples: float) -> float:
        """How long `samples` samples of a segment take on the base device (0 before calibration)."""
        return self.costs.get(segment, 0.0) * samples


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
    stopped_at: SamplerPosition | None = None
    """Set when the ranks agreed to stop before the epoch's end (a checkpoint was requested): the
    position after the last step every rank finished."""


@dataclass
class StepTotals:
    """Running sums over an epoch's steps, turned into its EpochStats at the end."""

    loss: float = 0.0
    compute: float = 0.0
    comm: float = 0.0
    samples: int = 0
    steps: int = 0
    losses: int = 0  # how many losses were summed (steps, or rounds for esync)

    def add(self, loss: float, compute: float, comm: float, samples: int, steps: int = 1) -> None:
        self.loss += loss
        self.losses += 1
        self.compute += compute
        self.comm += comm
        self.samples += samples
        self.steps += steps

    def stats(
        self, wall: float, extra: dict[str, float], stopped_at: SamplerPosition | None = None
    ) -> EpochStats:
        return EpochStats(
            loss=self.loss / max(self.losses, 1),
            samples=self.samples,
            steps=self.steps,
            compute_seconds=self.compute,
            comm_seconds=self.comm,
            wall_seconds=wall,
            extra=extra,
            stopped_at=stopped_at,
        )


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

    def calibrate(self, plan: Plan) -> dict[str, float]:
        """Per-sample seconds of each compute segment at this host's full speed, measured while no
        other rank computes; must leave the model, its gradients and the random state as they were."""

    @property
    def symmetric(self) -> bool:
        """Whether every rank runs the same segments (then all take the slowest rank's calibration)."""

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


def forward_loss(
    model: nn.Module, loss_fn: LossFn, batch: Any, amp: MixedPrecision | None = None
) -> torch.Tensor:
    """Mean loss of an (inputs, targets) batch already on the model's device, under autocast."""
    inputs, targets = batch
    if amp is None:
        return loss_fn(model(inputs), targets)
    with amp.autocast():
        return loss_fn(model(inputs), targets)


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (GPU kernels run asynchronously): before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def preserved_state(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> Iterator[None]:
    """Run something (a calibration) that must leave no trace: parameters, buffers, gradients, the
    optimizer's state and the random number generators are as they were afterwards."""
    saved = copy.deepcopy(model.state_dict())
    saved_optimizer = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        model.load_state_dict(saved)
        if optimizer is not None and saved_optimizer is not None:
            optimizer.load_state_dict(saved_optimizer)
        for param, grad in zip(model.parameters(), grads, strict=True):
            param.grad = grad
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def calibrate_step(ctx: WorkerContext, samples: int, with_optimizer_step: bool = False) -> dict[str, float]:
    """The per-sample cost of one step's compute segment: batch fetch, forward and backward, and the
    optimizer's step where the strategy's segment holds it (local-SGD strategies), at `samples`."""
    indices = np.arange(min(max(samples, 1), ctx.sampler.dataset_size))

    def step() -> None:
        ctx.optimizer.zero_grad(set_to_none=True)
        loss = forward_loss(ctx.model, ctx.loss_fn, ctx.batch(indices), ctx.amp)
        loss.backward()
        if with_optimizer_step:
            ctx.optimizer.step()
        synchronize(ctx.device)

    with preserved_state(ctx.model, ctx.optimizer):
        cost = per_sample_seconds(step, len(indices))
    return {"step": cost}


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


def broadcast_coalesced(tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Make every rank's `tensors` equal `src`'s, one broadcast per dtype (not one per tensor)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    with torch.no_grad():
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            dist.broadcast(flat, src=src)
            copy_from_flat(group, flat)


def average_model(model: nn.Module, world_size: int, weight: float | None = None) -> None:
    """Replace every rank's parameters and float buffers by their mean over all ranks; `weight`: this
    rank's weight in a weighted mean (the ranks' weights sum to 1)."""
    tensors = [t for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()]
    if not tensors or world_size == 1:
        return
    with torch.no_grad():
        flat = torch.cat([t.data.reshape(-1) for t in tensors])
        if weight is not None:
            flat.mul_(weight)
        dist.all_reduce(flat)
        if weight is None:
            flat.div_(world_size)
        copy_from_flat(tensors, flat)


def flat_parameters(params: Sequence[nn.Parameter]) -> torch.Tensor:
    """The parameters' values end to end (a copy)."""
    return torch.cat([p.data.reshape(-1) for p in params])


def copy_from_flat(tensors: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.data.copy_(flat[offset : offset + count].view_as(tensor))
        offset += count
