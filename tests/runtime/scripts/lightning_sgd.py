"""A LightningModule trained by `Trainer(strategy=HeteroStrategy())` on 71 samples, global batch 70,
for three epochs: epoch 0 splits evenly (no plan applies yet), epochs 1 and 2 by the plan (40/21/9),
whose second step has one sample (rank 0's; the others compute on a stand-in that counts zero).
Every rank keeps which samples each of its steps trained on; rank 0 replays the same global batches
with plain SGD in float64 on one process, from the same initial weights, and reports how far the
trained weights are from those.

With RELOAD=1 Lightning asks for a new training DataLoader every epoch. With CHECKPOINTS set,
Lightning saves its last checkpoint there, and a run that finds one resumes from it (to EPOCHS
epochs); rank 0 reports the weights it ends with."""

import json
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader, TensorDataset

from hetero_runtime.wrap import current_session, leave
from hetero_runtime.wrap.lightning import HeteroStrategy

torch.set_num_threads(1)
EPOCHS, LR = int(os.environ.get("EPOCHS", "3")), 0.5
CHECKPOINTS = os.environ.get("CHECKPOINTS")
RELOAD = os.environ.get("RELOAD") == "1"  # a new training DataLoader every epoch
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(71, 16, generator=generator)
targets = torch.randint(0, 5, (71,), generator=generator)
indices = torch.arange(71)


def build() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = build()
        self.seen: list[list[int]] = []  # per step: the samples this rank trained on
        self.plans: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        step = current_session().step
        assert step is not None
        self.seen.append([int(i) for i in index[: step.local_batch]])
        if batch_idx == 0:
            self.plans.append(current_session().plan.version)
        return functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


module = Classifier()
trainer = pl.Trainer(
    strategy=HeteroStrategy(global_batch=70),
    accelerator="cpu",
    devices=1,
    max_epochs=EPOCHS,
    reload_dataloaders_every_n_epochs=1 if RELOAD else 0,
    logger=False,
    enable_checkpointing=CHECKPOINTS is not None,
    callbacks=[ModelCheckpoint(dirpath=CHECKPOINTS, save_last=True)] if CHECKPOINTS else None,
    enable_progress_bar=False,
    enable_model_summary=False,
)
loader = DataLoader(TensorDataset(inputs, targets, indices), batch_size=24, shuffle=True)
last = Path(CHECKPOINTS, "last.ckpt") if CHECKPOINTS else None
trainer.fit(module, train_dataloaders=loader, ckpt_path=last if last is not None and last.exists() else None)

session = current_session()
every_rank: list[Any] = [None] * session.world_size
dist.all_gather_object(every_rank, module.seen)
report: dict[str, Any] = {
    "batch_lengths": [len(s) for s in module.seen],
    "plan_versions": module.plans,
    "steps": len(module.seen),
}
if session.rank == 0:
    report["weights"] = torch.cat([p.detach().reshape(-1) for p in module.net.parameters()]).tolist()
if session.rank == 0 and len(module.seen) == 2 * EPOCHS:  # a whole run, not a resumed one
    reference = build().double()
    initial = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    optimizer = torch.optim.SGD(reference.parameters(), lr=LR)
    for step in range(len(module.seen)):
        batch = [i for seen in every_rank for i in seen[step]]
        optimizer.zero_grad()
        functional.cross_entropy(reference(inputs[batch].double()), targets[batch]).backward()
        optimizer.step()
    trained = torch.cat([p.detach().reshape(-1) for p in module.net.parameters()]).double()
    replayed = torch.cat([p.detach().reshape(-1) for p in reference.parameters()])
    report["max_abs_diff"] = float((trained - replayed).abs().max())
    report["moved"] = float((replayed - initial).abs().max())
    # Each epoch in its own order (the loader's position carried the epoch on).
    firsts = {tuple(i for seen in every_rank for i in seen[e * 2]) for e in range(EPOCHS)}
    report["orders_differ"] = len(firsts) == EPOCHS
    report["samples_per_epoch"] = [
        sorted(i for seen in every_rank for s in seen[e * 2 : e * 2 + 2] for i in s) == list(range(71))
        for e in range(EPOCHS)
    ]
Path(os.environ["OUT_DIR"], f"rank-{session.rank}.json").write_text(json.dumps(report))
leave()
