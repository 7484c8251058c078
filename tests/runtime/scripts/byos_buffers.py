"""Batch norm's running statistics under HeteroModel on 3 ranks of uneven shares (40/21/9 of 70): at
every training forward each rank must hold rank 0's buffers, as under DDP's broadcast_buffers. A
second model with broadcast_buffers=False is the control: there the ranks' statistics drift apart,
so the data would show a broadcast that did not happen. Under no_sync() nothing is broadcast."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

import hetero_runtime.wrap as heterotrain

torch.set_num_threads(1)
session = heterotrain.init()
generator = torch.Generator().manual_seed(1)
# Each sample's features are shifted by its index, so different shares have different statistics.
inputs = torch.randn(70, 6, generator=generator) + torch.arange(70).unsqueeze(1) / 10
targets = torch.randint(0, 3, (70,), generator=generator)


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def seen_at_forwards(
    model: heterotrain.HeteroModel, steps: int, no_sync_step: int | None
) -> list[list[float]]:
    """The running mean the module holds as each forward starts (after any broadcast)."""
    seen: list[list[float]] = []
    model.module.register_forward_pre_hook(lambda module, _: seen.append(module[1].running_mean.tolist()))
    loader = heterotrain.HeteroDataLoader(TensorDataset(inputs, targets), batch_size=70)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(steps):
        loader.set_epoch(epoch)
        for x, y in loader:
            if epoch == no_sync_step:
                with model.no_sync():
                    functional.cross_entropy(model(x), y).backward()
            else:
                functional.cross_entropy(model(x), y).backward()
                optimizer.step()
                optimizer.zero_grad()
    return seen


synced = seen_at_forwards(heterotrain.HeteroModel(net()), 4, no_sync_step=2)
control = seen_at_forwards(heterotrain.HeteroModel(net(), broadcast_buffers=False), 4, no_sync_step=None)
every_rank: list[object] = [None] * dist.get_world_size()
dist.all_gather_object(every_rank, {"synced": synced, "control": control})
report = {"planned_batch": session.plan.local_batches[session.rank] if session.plan else None}
report["ranks"] = every_rank
Path(os.environ["OUT_DIR"], f"rank-{session.rank}.json").write_text(json.dumps(report))
heterotrain.leave()
