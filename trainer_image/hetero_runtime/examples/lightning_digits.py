"""A PyTorch Lightning script on heterotrain: the LightningModule, its optimizer, scheduler, gradient
clipping and checkpoints are Lightning's as usual; `strategy=HeteroStrategy()` takes DDP's place, so
each rank trains on the share of every global batch that the plan gives it, re-split between epochs.

    python lightning_digits.py --epochs 8          # the job's command (one process per worker)
"""

import argparse
import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import DataLoader

from hetero_runtime.examples.ddp_digits_hetero import ResidualCNN, digits
from hetero_runtime.wrap import leave
from hetero_runtime.wrap.lightning import HeteroStrategy


class DigitsClassifier(pl.LightningModule):
    def __init__(self, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = ResidualCNN()
        self.lr = lr
        self.trained_on = ""

    def on_train_start(self) -> None:
        self.trained_on = self.device.type  # Lightning moves the module back to the CPU when fit ends

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = functional.cross_entropy(self.model(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.7)]


def accuracy(model: nn.Module, test: Any) -> float:
    model.eval()
    with torch.no_grad():
        x, y = test.tensors
        return float((model(x).argmax(dim=1) == y).float().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, over all ranks")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--out", type=Path, default=None, help="write the final metrics here (JSON)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    train, test = digits()
    module = DigitsClassifier(args.lr)
    trainer = pl.Trainer(
        strategy=HeteroStrategy(global_batch=args.batch_size),
        accelerator="auto",
        devices=1,
        max_epochs=args.epochs,
        gradient_clip_val=2.0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, DataLoader(train, batch_size=args.batch_size, shuffle=True))
    if trainer.is_global_zero and args.out is not None:
        metrics = {
            "accuracy": accuracy(module.model.cpu(), test),
            "world_size": trainer.world_size,
            "device": module.trained_on,
        }
        args.out.write_text(json.dumps(metrics))
    leave()  # every rank leaves the job together, and ends


if __name__ == "__main__":
    main()
