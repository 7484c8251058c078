"""Keep your training loop: wrap the model and the data, and heterotrain does the rest.

    import hetero_runtime.wrap as heterotrain

    heterotrain.init()                                   # instead of dist.init_process_group
    model = heterotrain.HeteroModel(net)                 # instead of DistributedDataParallel
    loader = heterotrain.HeteroDataLoader(train_set, batch_size=64)   # the global batch
    checkpoint = heterotrain.Checkpoint(model=model, optimizer=opt, scheduler=sched, loader=loader)
    checkpoint.restore()
    while loader.epoch < epochs:
        for x, y in loader:                              # this rank's planned share of each batch
            ...  # your forward, backward, clipping, GradScaler, optimizer and scheduler steps
        checkpoint.save()
    heterotrain.leave()                                  # every rank leaves together, and ends

Each rank gets the batch size the plan gives it (re-split at epoch boundaries when a new plan
arrives); after each backward pass `.grad` holds the gradient of the whole global batch.

Mixed precision that holds across GPU classes: `with heterotrain.autocast():` around the forward pass
and `scaler = heterotrain.GradScaler()` in place of torch's (see `hetero_runtime.precision`).
"""

from contextlib import AbstractContextManager

import torch

from hetero_runtime.wrap.checkpoint import Checkpoint
from hetero_runtime.wrap.loader import HeteroDataLoader
from hetero_runtime.wrap.model import HeteroModel
from hetero_runtime.wrap.session import Session, WrapperError, close, current_session, init, leave

__all__ = [
    "Checkpoint",
    "GradScaler",
    "HeteroDataLoader",
    "HeteroModel",
    "Session",
    "WrapperError",
    "autocast",
    "close",
    "current_session",
    "device",
    "init",
    "leave",
]


def device() -> torch.device:
    """This worker's device (its GPU when it has one): where HeteroModel put the model."""
    return current_session().device


def autocast() -> AbstractContextManager[None]:
    """Autocast in this rank's format of the job's precision (spec.precision; under auto: bf16 on a
    GPU with bf16, fp16 on one without, none on a CPU), for the forward pass and the loss."""
    return current_session().amp.autocast()


def GradScaler() -> torch.amp.GradScaler:  # named as the torch class it stands in for
    """The job-wide loss scaler: enabled on every rank, with the same settings, when any rank of the
    job computes in fp16 (so that every rank's gradient carries the same scale and every rank skips
    an overflowing step together); disabled, passing everything through, otherwise. Use it as
    torch's: `scaler.scale(loss).backward()`, `scaler.unscale_(opt)`, `scaler.step(opt)`,
    `scaler.update()`."""
    return current_session().grad_scaler()
