"""HeteroModel: the user's model, whose gradients leave every backward pass already synchronised.

When a backward pass ends, the gradients of all ranks are all-reduced with weights b_i/B (the data
strategy's `synchronize_gradients`), so `.grad` holds the gradient of the whole global batch, as a
single process would compute it, however unevenly the plan split that batch. The user's loop then
unscales, clips and steps as it always did.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from hetero_runtime.gns import estimate_noise
from hetero_runtime.strategies.base import broadcast_model, synchronize, trainable
from hetero_runtime.strategies.data import synchronize_gradients
from hetero_runtime.wrap.session import Session, StepShare, WrapperError, current_session


class HeteroModel(nn.Module):
    """Wrap the model as a DDP script wraps it in DistributedDataParallel; build the optimizer on
    either this wrapper's parameters or the model's (they are the same tensors).

    The loss must be a mean over the local batch (as under DDP): the weights b_i/B turn the ranks'
    means into the mean over the global batch."""

    def __init__(self, module: nn.Module, session: Session | None = None) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise WrapperError(f"HeteroModel(module=...): expected a torch.nn.Module, got {type(module)!r}")
        self.session = session or current_session()
        module.to(self.session.device)  # in place: an optimizer built already keeps its parameters
        self.module = module
        self.params = trainable(module)
        if not self.params:
            raise WrapperError("HeteroModel(module=...): the model has no parameter that requires a gradient")
        if self.session.world_size > 1:
            broadcast_model(module)  # every rank starts from rank 0's weights, as DDP does
        self._queued = False
        self._before_stand_in: list[torch.Tensor | None] | None = None
        self.synchronized_steps = 0
        for param in self.params:
            param.register_post_accumulate_grad_hook(self._on_gradient)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        share = self.session.step
        if share is not None and share.local_batch == 0 and torch.is_grad_enabled():
            # A stand-in step: keep the gradients as they are now (accumulated ones included), so the
            # stand-in's own gradient can be taken out again after backward.
            self._before_stand_in = [None if p.grad is None else p.grad.clone() for p in self.params]
        return self.module(*args, **kwargs)

    def _on_gradient(self, _param: torch.Tensor) -> None:
        # Once per backward pass: the engine runs the callback after every gradient is accumulated.
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._queued = False
        session = self.session
        share = session.step
        started = session.step_started
        synchronize(session.device)
        compute = 0.0
        if started is not None:
            # A simulated slower device takes 1/speed times as long for the work just done.
            compute = session.simulator.finish(started, time.perf_counter() - started.wall)
        sync_start = time.perf_counter()
        local, sizes = self._weights(share)
        if local == 0:
            self._drop_stand_in_gradient()
        result = synchronize_gradients(self.params, local, sum(sizes), 0.0, session.rank, session.world_size)
        comm = time.perf_counter() - sync_start
        self.synchronized_steps += 1
        if share is None or started is None:
            return  # the script feeds its own loader: even weights, and no per-step measurement
        norms = [*result.local_sq_norms, result.global_sq_norm]
        if all(math.isfinite(x) for x in norms):  # an fp16 overflow step says nothing about noise
            session.noise.update(estimate_noise(share.sizes, result.local_sq_norms, result.global_sq_norm))
        session.pending_timing = (compute, sync_start - started.wall, comm)

    def _drop_stand_in_gradient(self) -> None:
        """Back to the gradients from before the stand-in's forward (even a non-finite one goes)."""
        saved = self._before_stand_in or [None] * len(self.params)
        self._before_stand_in = None
        for param, before in zip(self.params, saved, strict=True):
            if param.grad is None:
                continue
            if before is None:
                param.grad.zero_()
            else:
                param.grad.copy_(before)

    def _weights(self, share: StepShare | None) -> tuple[int, list[int]]:
        """This rank's count and every rank's, from the loader; without it, an even split (DDP's mean)."""
        if share is None:
            return 1, [1] * self.session.world_size
        return share.local_batch, share.sizes

    # Checkpoints hold the model's own keys (no "module." prefix), loadable into the bare model.
    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)
