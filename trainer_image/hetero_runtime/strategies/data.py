"""`data`: synchronous data parallelism with uneven local batches (Cannikin).

Every rank computes the mean gradient g_i of its b_i samples; the ranks all-reduce r_i·g_i with
r_i = b_i/B, so the update is exactly the one a single process would make on the whole global batch.
The all-reduce is the wrapper's (`wrap/buckets.py`): buckets that leave while backward still runs,
the last one carrying each rank's |g_i|² (for the gradient noise scale), the weighted loss and a stop
vote, so a step costs no message beyond the gradients' own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from hetero_operator.plan import Plan
from hetero_runtime.gns import NoiseTracker, estimate_noise
from hetero_runtime.metrics import StepRecord
from hetero_runtime.prefetch import staged
from hetero_runtime.sampler import SamplerPosition
from hetero_runtime.strategies.base import (
    EpochStats,
    StepTotals,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    calibrate_step,
    forward_loss,
    synchronize,
    trainable,
)
from hetero_runtime.wrap.buckets import BucketedAllReduce, Reduced

RIDERS = 2  # the weighted loss, the stop vote


@dataclass(frozen=True)
class SyncResult:
    loss: float  # global mean loss of the step
    local_sq_norms: list[float]  # |g_i|² of every rank (unscaled)
    global_sq_norm: float  # |g|² after synchronisation (unscaled)
    stop: bool = False  # some rank asked to stop after this step


def gradient_reducer(params: Sequence[nn.Parameter], rank: int, world: int) -> BucketedAllReduce:
    """The buckets of the data strategy's all-reduce, with its two riders."""
    return BucketedAllReduce(params, rank, world, riders=RIDERS)


def sync_result(reduced: Reduced, loss_scale: float) -> SyncResult:
    """Under fp16 loss scaling the gradients carry the scale S, the same on every rank (a power of
    two, so scaling is exact); the norms are reported without it."""
    assert reduced.norms is not None, "the data strategy measures the norms on every step"
    unscale = 1.0 / (loss_scale * loss_scale)
    loss, stop = reduced.riders
    return SyncResult(
        loss=loss,
        local_sq_norms=[x * unscale for x in reduced.norms.local_sq],
        global_sq_norm=reduced.norms.global_sq * unscale,
        stop=stop > 0,
    )


def synchronize_gradients(
    params: Sequence[nn.Parameter],
    local_batch: int,
    global_batch: int,
    local_loss: float,
    rank: int,
    world: int,
    loss_scale: float = 1.0,
    stop: bool = False,
    reducer: BucketedAllReduce | None = None,
) -> SyncResult:
    """The data strategy's all-reduce, Σ (b_i/B)·g_i into every rank's .grad, for gradients computed
    already (the strategy itself sends its buckets during backward). Pass the same `reducer` every
    step to keep its buffers."""
    reducer = reducer or gradient_reducer(params, rank, world)
    weight = local_batch / global_batch
    reducer.begin(weight, measure=True, riders=(local_loss * weight, 1.0 if stop else 0.0))
    for index in range(len(reducer.params)):
        reducer.ready(index)
    return sync_result(reducer.finish(), loss_scale)


class DataStrategy:
    name = "data"
    symmetric = True

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.params = trainable(ctx.model)
        self.noise = NoiseTracker()
        self.reduce = gradient_reducer(self.params, ctx.rank, ctx.world_size)
        self._backward_sends = False  # only the step's own backward sends buckets (not calibration's)
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(partial(self._on_gradient, index))

    def _on_gradient(self, index: int, _param: torch.Tensor) -> None:
        if self._backward_sends:
            self.reduce.ready(index)

    def start(self, plan: Plan) -> None:
        if self.ctx.world_size > 1:
            broadcast_model(self.ctx.model)
        self.apply_plan(plan)

    def apply_plan(self, plan: Plan) -> None:
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def calibrate(self, plan: Plan) -> dict[str, float]:
        return calibrate_step(self.ctx, plan.global_batch // plan.world_size)

    def _compute(self, batch: Any, local_batch: int, global_batch: int, stop: bool) -> None:
        """Forward and backward of this rank's samples (scaled under fp16), the buckets leaving as
        backward fills them. A rank with no samples in this step sends zeros."""
        ctx = self.ctx
        weight = local_batch / global_batch
        self.reduce.zero_gradients()
        vote = 1.0 if stop else 0.0
        if batch is None:
            self.reduce.begin(0.0, measure=True, riders=(0.0, vote))
            return
        loss = forward_loss(ctx.model, ctx.loss_fn, batch, ctx.amp)
        # The loss rides as a tensor: reading it here would wait for the device before backward.
        self.reduce.begin(weight, measure=True, riders=(loss.detach().float() * weight, vote))
        self._backward_sends = True
        try:
            ctx.amp.backward(loss)
        finally:
            self._backward_sends = False

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        ctx.model.train()
        totals = StepTotals()
        started = time.perf_counter()
        stopped_at = None
        steps = staged(
            ctx.sampler.epoch(position, plan.local_batches),
            lambda step: (step, ctx.batch(step.indices) if step.sizes[ctx.rank] else None),
            ctx.device,
        )
        while True:
            # Fetching is part of the step: a rank slow to load its data is slow.
            t0 = time.perf_counter()
            watch = ctx.simulator.begin()
            fetched = next(steps, None)
            if fetched is None:
                break
            step, batch = fetched
            local_batch = step.sizes[ctx.rank]
            self._compute(batch, local_batch, sum(step.sizes), ctx.stop.requested())
            synchronize(ctx.device)
            compute = ctx.simulator.finish(watch, ctx.full_speed_seconds("step", local_batch))
            sync_start = time.perf_counter()
            result = sync_result(self.reduce.finish(), ctx.amp.loss_scale)
            comm = time.perf_counter() - sync_start
            taken = ctx.amp.step(ctx.optimizer)
            if taken:
                self.noise.update(estimate_noise(step.sizes, result.local_sq_norms, result.global_sq_norm))
            ctx.metrics.record_step(
                StepRecord(compute, sync_start - t0, comm, time.perf_counter() - t0, local_batch)
            )
            ctx.metrics.set_loss(result.loss)
            totals.add(result.loss, compute, comm, local_batch)
            if ctx.guard is not None:
                suspects = [r for r, sq in enumerate(result.local_sq_norms) if not math.isfinite(sq)]
                ctx.guard.record_shared_loss(result.loss, taken, position.epoch, suspects)
                ctx.guard.after_step(position.epoch)
            if result.stop:
                stopped_at = step.position_after
                break
        extra: dict[str, float] = {"skipped_steps": float(ctx.amp.skipped_steps)}
        estimate = self.noise.estimate
        if estimate is not None:
            extra["gradient_noise_scale"] = estimate.noise_scale
            ctx.metrics.set_noise_scale(estimate.noise_scale)
        return totals.stats(time.perf_counter() - started, extra, stopped_at)

    def evaluation_model(self) -> nn.Module:
        return self.ctx.model

    def state_dict(self) -> dict[str, Any]:
        return {"precision": self.ctx.amp.state_dict()}

    def close(self) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "precision" in state:
            self.ctx.amp.load_state_dict(state["precision"])
