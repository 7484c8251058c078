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
"""

import torch

from hetero_runtime.wrap.checkpoint import Checkpoint
from hetero_runtime.wrap.loader import HeteroDataLoader
from hetero_runtime.wrap.model import HeteroModel
from hetero_runtime.wrap.session import Session, WrapperError, close, current_session, init, leave

__all__ = [
    "Checkpoint",
    "HeteroDataLoader",
    "HeteroModel",
    "Session",
    "WrapperError",
    "close",
    "current_session",
    "device",
    "init",
    "leave",
]


def device() -> torch.device:
    """This worker's device (its GPU when it has one): where HeteroModel put the model."""
    return current_session().device
