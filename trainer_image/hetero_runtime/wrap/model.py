"""HeteroModel: the user's model, whose gradients leave every backward pass already synchronised.

By the end of each backward pass the gradients of all ranks are all-reduced with weights b_i/B (the
data strategy's synchronisation, in buckets that overlap backward), so `.grad` holds the gradient of
the whole global batch, as a single process would compute it, however unevenly the plan split that
batch. The user's loop then unscales, clips and steps as it always did.

Gradient accumulation works as under DDP: backward passes inside `model.no_sync()` stay local, and
the next one outside it synchronises their sum. Each pass is weighted by its own step's b_i/B before
it is added, so the sum is exact even where the steps split the batch differently (an epoch's short
last step, a new plan).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn

from hetero_runtime.divergence import DivergenceGuard
from hetero_runtime.gns import estimate_noise
from hetero_runtime.simulate import Stopwatch
from hetero_runtime.strategies.base import broadcast_coalesced, broadcast_model, synchronize, trainable
from hetero_runtime.wrap.buckets import BUCKET_CAP_ELEMENTS, BucketedAllReduce
from hetero_runtime.wrap.session import Session, StepShare, WrapperError, current_session


class HeteroModel(nn.Module):
    """Wrap the model as a DDP script wraps it in DistributedDataParallel; build the optimizer on
    either this wrapper's parameters or the model's (they are the same tensors).

    The loss must be a mean over the local batch (as under DDP): the weights b_i/B turn the ranks'
    means into the mean over the global batch. The gradient noise scale is measured every
    `noise_every` steps (its squared norms cost passes over the gradients). As DDP's
    `broadcast_buffers=True` does, every training forward first gives each rank rank 0's buffers
    (batch norm's running statistics), so that they never drift apart."""

    def __init__(
        self,
        module: nn.Module,
        session: Session | None = None,
        noise_every: int = 4,
        bucket_cap_elements: int = BUCKET_CAP_ELEMENTS,
        broadcast_buffers: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(module, nn.Module):
            raise WrapperError(f"HeteroModel(module=...): expected a torch.nn.Module, got {type(module)!r}")
        if noise_every < 1:
            raise WrapperError(f"HeteroModel(noise_every={noise_every}): give a step count >= 1")
        self.session = session or current_session()
        self.session.model = module
        module.to(self.session.device)  # in place: an optimizer built already keeps its parameters
        self.module = module
        self.params = trainable(module)
        if not self.params:
            raise WrapperError("HeteroModel(module=...): the model has no parameter that requires a gradient")
        if self.session.world_size > 1:
            broadcast_model(module)  # every rank starts from rank 0's weights, as DDP does
        self.session.guard = DivergenceGuard(self.params, self.session.world_size, self.session.device)
        self.noise_every = noise_every
        self.buffers_to_sync = list(module.buffers()) if broadcast_buffers else []
        self._buffer_wait = 0.0  # seconds this step's forward spent in the buffers' broadcast
        # One rider a rank: each rank's recent pace, so that every rank paces to the same base device.
        world = self.session.world_size
        self.reduce = BucketedAllReduce(
            self.params, self.session.rank, world, bucket_cap_elements, riders=world
        )
        self._in_backward = False
        self._skip_sync = False  # inside no_sync()
        self._accumulating: list[torch.utils.hooks.RemovableHandle] = []  # weighting hooks of a window
        self.synchronized_steps = 0
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(partial(self._on_gradient, index))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        session = self.session
        if (
            self.buffers_to_sync
            and session.world_size > 1
            and not session.local_steps  # (their averaging evens the buffers out at every epoch end)
            and not self._skip_sync  # (as DDP: no_sync() passes keep what they have)
            and self.module.training
            and torch.is_grad_enabled()
        ):
            # A wait for the other ranks, not compute: a simulated slower device must not stretch it.
            waiting = time.perf_counter()
            broadcast_coalesced(self.buffers_to_sync)
            self._buffer_wait += time.perf_counter() - waiting
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside stay on this rank (gradient accumulation); the first one after it
        synchronises everything accumulated, as DDP's `no_sync` does. Under the local-step
        strategies every gradient is local anyway: nothing changes."""
        if self.session.local_steps:
            yield
            return
        if not self._accumulating:
            self._open_window()
        self._skip_sync = True
        try:
            yield
        finally:
            self._skip_sync = False

    def _open_window(self) -> None:
        """From now until the next synchronised pass, each pass's gradient is weighted as it arrives.
        A gradient already there is the same on every rank (synchronised before, or zero): the world
        sums it back to itself once each rank holds 1/world of it."""
        world = self.session.world_size
        with torch.no_grad():
            for param in self.params:
                if param.grad is not None:
                    param.grad.div_(world)
        self._accumulating = [param.register_hook(self._weigh_incoming) for param in self.params]

    def _weigh_incoming(self, grad: torch.Tensor) -> torch.Tensor:
        local, sizes = self._weights(self.session.step)
        if local == 0:
            return torch.zeros_like(grad)  # a stand-in batch counts nothing, not even a non-finite value
        return grad * (local / sum(sizes))

    def _on_gradient(self, index: int, _param: torch.Tensor) -> None:
        if self.session.local_steps:
            self._on_local_gradient()
            return
        if self._skip_sync:
            if not self._in_backward:
                self._in_backward = True
                torch.autograd.Variable._execution_engine.queue_callback(self._after_unsynced_backward)
            return
        if not self._in_backward:
            # The first gradient of this backward pass: weigh it, and have the engine call back
            # once every gradient is accumulated. After no_sync() passes, the hooks weighed them all.
            self._in_backward = True
            if self._accumulating:
                self.reduce.begin(1.0, measure=False, riders=self._paces())
            else:
                local, sizes = self._weights(self.session.step)
                measure = self.session.step is not None and self.synchronized_steps % self.noise_every == 0
                self.reduce.begin(local / sum(sizes), measure, riders=self._paces())
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)
        self.reduce.ready(index)

    def _after_unsynced_backward(self) -> None:
        self._in_backward = False
        self._record_local_timing()

    def _after_backward(self) -> None:
        self._in_backward = False
        session = self.session
        share, started = session.step, session.step_started
        synchronize(session.device)
        compute, waited = 0.0, self._buffer_wait
        self._buffer_wait = 0.0
        if started is not None:
            # A simulated slower device takes 1/speed times as long as the base device for this work.
            work = Stopwatch(started.wall + waited)
            measured = time.perf_counter() - work.wall
            samples = share.local_batch if share is not None else 0
            compute = session.simulator.finish(work, session.base.full_speed_seconds(samples, measured))
        sync_start = time.perf_counter()
        reduced = self.reduce.finish()
        norms = reduced.norms
        session.base.share(reduced.riders)
        comm = time.perf_counter() - sync_start + waited
        for handle in self._accumulating:
            handle.remove()
        self._accumulating = []
        self.synchronized_steps += 1
        if share is None or started is None:
            return  # the script feeds its own loader: even weights, and no per-step measurement
        if norms is not None and all(math.isfinite(x) for x in [*norms.local_sq, norms.global_sq]):
            # (an fp16 overflow step says nothing about the noise)
            session.noise.update(estimate_noise(share.sizes, norms.local_sq, norms.global_sq))
        session.pending_timing = (compute, sync_start - started.wall, comm)

    def _paces(self) -> list[float]:
        """This rank's recent pace in its own slot, zeros in the others' (they add theirs)."""
        paces = [0.0] * self.session.world_size
        paces[self.session.rank] = self.session.base.per_sample
        return paces

    def _on_local_gradient(self) -> None:
        """Local-step strategies: each rank keeps its own gradient for its own optimizer step; the
        loader averages the parameters before the next batch."""
        if self._in_backward:
            return
        if self.session.step is None:
            strategy = self.session.plan.strategy.value if self.session.plan else "?"
            raise WrapperError(
                f"strategy {strategy!r} averages the parameters as the loader's steps end: feed the model "
                "from heterotrain.HeteroDataLoader (or set spec.parallelism.strategy: data)"
            )
        self._in_backward = True
        torch.autograd.Variable._execution_engine.queue_callback(self._after_local_backward)

    def _after_local_backward(self) -> None:
        self._in_backward = False
        share = self.session.step
        if share is not None and share.local_batch == 0:
            # A stand-in sample (this rank has none in a short last step) must not move the model.
            for param in self.params:
                if param.grad is not None:
                    param.grad.zero_()
        self.synchronized_steps += 1
        self._record_local_timing()

    def _record_local_timing(self) -> None:
        """A pass with no synchronisation: its compute (stretched on a simulated slower device)."""
        session = self.session
        synchronize(session.device)
        started = session.step_started
        if started is not None:
            measured = time.perf_counter() - started.wall
            samples = session.step.local_batch if session.step is not None else 0
            compute = session.simulator.finish(started, session.base.full_speed_seconds(samples, measured))
            session.pending_timing = (compute, time.perf_counter() - started.wall, 0.0)

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
