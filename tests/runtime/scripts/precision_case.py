"""The case the mixed-precision tests share: a small classifier, its data, the plan's uneven split, the
ranks' formats (what a CPU, an A100 and a V100 compute in under `precision: auto`), and the float64
single-process reference that trains on the same global batches.

The runtime's sampler orders each epoch by (seed, epoch) alone and hands the ranks consecutive
slices of that order, so a step's global batch is the order's next B samples, whatever the split."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

from hetero_operator.plan import Plan
from hetero_runtime.sampler import epoch_order

SAMPLES, FEATURES, CLASSES = 120, 12, 4
LOCAL_BATCHES = [20, 13, 7]  # global batch 40: three steps an epoch
GLOBAL_BATCH = sum(LOCAL_BATCHES)
EPOCHS = 2
LR, MOMENTUM = 0.3, 0.9
SEED = 0
RANK_PRECISIONS = ["fp32", "bf16", "fp16"]  # a CPU, an A100 and a V100 under auto
LIGHTNING_PRECISIONS = ["32-true", "bf16-mixed", "16-mixed"]  # the same, as a script picks them


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(SAMPLES, FEATURES, generator=generator)
    targets = torch.randint(0, CLASSES, (SAMPLES,), generator=generator)
    return TensorDataset(inputs, targets)


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 24), nn.Tanh(), nn.Linear(24, CLASSES))


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def write_plan(path: Path) -> None:
    plan = Plan(version=1, world_size=3, global_batch=GLOBAL_BATCH, local_batches=LOCAL_BATCHES)
    path.write_text(plan.to_json())


def reference_parameters() -> tuple[torch.Tensor, torch.Tensor]:
    """(initial, trained) parameters of one process training on every global batch in float64."""
    data = dataset()
    inputs, targets = data.tensors[0].double(), data.tensors[1]
    model = build_model().double()
    initial = flat(model)
    opt = optimizer(model)
    for epoch in range(EPOCHS):
        order = epoch_order(SAMPLES, SEED, epoch)
        for start in range(0, SAMPLES, GLOBAL_BATCH):
            batch = torch.as_tensor(order[start : start + GLOBAL_BATCH])
            opt.zero_grad()
            functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            opt.step()
    return initial, flat(model)


def write_result(out_dir: str, rank: int, model: nn.Module, **more: object) -> None:
    report = {"parameters": flat(model).double().tolist(), **more}
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(report))
