"""`data`: synchronous data parallelism with uneven local batches (Cannikin).

Every rank computes the mean gradient g_i of its b_i samples; the ranks all-reduce r_i·g_i with
r_i = b_i/B, so the update is exactly the one a single process would make on the whole global batch.
The same all-reduce carries each rank's |g_i|² and weighted loss, from which the gradient noise scale
is estimated without extra messages.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
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
    flat_gradients,
    forward_loss,
    set_gradients_from_flat,
    synchronize,
    trainable,
)


@dataclass(frozen=True)
class SyncResult:
    loss: float  # global mean loss of the step
    local_sq_norms: list[float]  # |g_i|² of every rank (unscaled)
    global_sq_norm: float  # |g|² after synchronisation (unscaled)
    stop: bool = False  # some rank asked to stop after this step


def synchronize_gradients(
    params: Sequence[nn.Parameter],
    local_batch: int,
    global_batch: int,
    local_loss: float,
    rank: int,
    world: int,
    loss_scale: float = 1.0,
    stop: bool = False,
) -> SyncResult:
    """All-reduce Σ (b_i/B)·g_i into every rank's .grad, plus the norms, the loss and a stop vote riding
    along. Under fp16 loss scaling the gradients carry the scale S, the same on every rank (a power of
    two, so scaling is exact): the sum is S·Σ (b_i/B)·g_i, and the norms are reported without S."""
    weight = local_batch / global_batch
    grads = flat_gradients(params)
    extras = torch.zeros(world + 2, dtype=grads.dtype, device=grads.device)
    if local_batch > 0:
        extras[rank] = grads.square().sum()
    extras[world] = local_loss * weight
    extras[world + 1] = 1.0 if stop else 0.0
    buffer = torch.cat([grads.mul_(weight), extras])
    if world > 1:
        dist.all_reduce(buffer)
    count = buffer.numel() - world - 2
    set_gradients_from_flat(params, buffer[:count])
    unscale = 1.0 / (loss_scale * loss_scale)
    summary = torch.cat([buffer[count:], buffer[:count].square().sum().reshape(1)]).tolist()
    return SyncResult(
        loss=summary[world],
        local_sq_norms=[x * unscale for x in summary[:world]],
        global_sq_norm=summary[-1] * unscale,
        stop=summary[world + 1] > 0,
    )


class DataStrategy:
    name = "data"
    symmetric = True

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.params = trainable(ctx.model)
        self.noise = NoiseTracker()

    def start(self, plan: Plan) -> None:
        if self.ctx.world_size > 1:
            broadcast_model(self.ctx.model)
        self.apply_plan(plan)

    def apply_plan(self, plan: Plan) -> None:
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def calibrate(self, plan: Plan) -> dict[str, float]:
        return calibrate_step(self.ctx, plan.global_batch // plan.world_size)

    def _compute(self, batch: Any) -> float:
        """Forward and backward of this rank's samples (scaled under fp16); the unscaled mean loss."""
        ctx = self.ctx
        for p in self.params:
            p.grad = None
        if batch is None:
            return 0.0
        loss = forward_loss(ctx.model, ctx.loss_fn, batch, ctx.amp)
        ctx.amp.backward(loss)
        return float(loss.detach())

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
            local_loss = self._compute(batch)
            synchronize(ctx.device)
            compute = ctx.simulator.finish(watch, ctx.full_speed_seconds("step", local_batch))
            sync_start = time.perf_counter()
            result = synchronize_gradients(
                self.params,
                local_batch,
                sum(step.sizes),
                local_loss,
                ctx.rank,
                ctx.world_size,
                loss_scale=ctx.amp.loss_scale,
                stop=ctx.stop.requested(),
            )
            comm = time.perf_counter() - sync_start
            if ctx.amp.step(ctx.optimizer):
                self.noise.update(estimate_noise(step.sizes, result.local_sq_norms, result.global_sq_norm))
            ctx.metrics.record_step(
                StepRecord(compute, sync_start - t0, comm, time.perf_counter() - t0, local_batch)
            )
            ctx.metrics.set_loss(result.loss)
            totals.add(result.loss, compute, comm, local_batch)
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
