"""The precision case (`precision_case.py`) trained by three ranks that compute in different formats
(HETEROTRAIN_PRECISION, or LIGHTNING_PRECISION, per rank), by the loop LOOP names:

- `runtime`: the runtime's own loop (`TrainingJob`, the data strategy);
- `wrapper`: a script of the user's own with `HeteroModel`, `heterotrain.autocast()` and
  `heterotrain.GradScaler()`;
- `raw`: the same script as users often write it for mixed GPUs, with torch's own autocast and
  GradScaler (enabled only on the fp16 rank), which scales the ranks' losses differently;
- `lightning`: a LightningModule under `HeteroStrategy`, each rank with its own `precision`.

Each rank writes its trained parameters to OUT_DIR/rank-N.json."""

import os
from contextlib import nullcontext
from typing import Any

import torch
from precision_case import (
    EPOCHS,
    GLOBAL_BATCH,
    build_model,
    dataset,
    optimizer,
    write_result,
)
from torch.nn import functional

torch.set_num_threads(1)
LOOP = os.environ["LOOP"]
RANK = int(os.environ["RANK"])
OUT_DIR = os.environ["OUT_DIR"]


def runtime() -> None:
    from hetero_runtime.api import TrainingJob
    from hetero_runtime.exiting import end_now

    model = build_model()
    job = TrainingJob(
        model=model,
        optimizer=optimizer(model),
        dataset=dataset(),
        loss_fn=functional.cross_entropy,
        epochs=EPOCHS,
        global_batch=GLOBAL_BATCH,
    )
    result = job.fit()
    skipped = result.epochs[-1].extra.get("skipped_steps", 0.0)
    write_result(OUT_DIR, RANK, model, precision=result.precision, skipped=skipped)
    end_now()


def wrapper(raw: bool) -> None:
    import hetero_runtime.wrap as heterotrain

    heterotrain.init()
    model = heterotrain.HeteroModel(build_model())
    opt = optimizer(model)
    loader = heterotrain.HeteroDataLoader(dataset(), batch_size=GLOBAL_BATCH)
    if raw:  # the format picked per device, and loss scaling only where it is fp16
        formats = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
        dtype = formats[os.environ["HETEROTRAIN_PRECISION"]]
        scaler: Any = torch.amp.GradScaler("cpu", enabled=dtype is torch.float16)

        def autocast() -> Any:
            return nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)

    else:
        scaler = heterotrain.GradScaler()
        autocast = heterotrain.autocast

    for _ in range(EPOCHS):
        for x, y in loader:
            opt.zero_grad()
            with autocast():
                loss = functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    write_result(OUT_DIR, RANK, model, scale=float(scaler.get_scale()) if scaler.is_enabled() else 1.0)
    heterotrain.leave()


def lightning() -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.precision import MixedPrecision
    from torch.utils.data import DataLoader

    import hetero_runtime.wrap as heterotrain
    from hetero_runtime.wrap.lightning import HeteroStrategy

    class Classifier(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = build_model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return optimizer(self.net)

    precision = os.environ["LIGHTNING_PRECISION"]
    # Lightning turns precision="16-mixed" into bf16 on a CPU; a V100's plugin is given as it is there.
    chosen: dict[str, Any] = (
        {"plugins": [MixedPrecision("16-mixed", "cpu")]}
        if precision == "16-mixed"
        else {"precision": precision}
    )
    module = Classifier()
    trainer = pl.Trainer(
        strategy=HeteroStrategy(global_batch=GLOBAL_BATCH),
        accelerator="cpu",
        devices=1,
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **chosen,
    )
    trainer.fit(module, train_dataloaders=DataLoader(dataset(), batch_size=GLOBAL_BATCH // 3))
    plugin = trainer.strategy.precision_plugin
    write_result(OUT_DIR, RANK, module.net, plugin=type(plugin).__name__)
    heterotrain.leave()


if LOOP == "runtime":
    runtime()
elif LOOP in ("wrapper", "raw"):
    wrapper(raw=LOOP == "raw")
else:
    lightning()
