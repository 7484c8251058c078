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
from hetero_runtime.sampler import SamplerPosition
from hetero_runtime.strategies.base import (
    EpochStats,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    fetch_batch,
    flat_gradients,
    forward_loss,
    set_gradients_from_flat,
    trainable,
)


@dataclass(frozen=True)
class SyncResult:
    loss: float  # global mean loss of the step
    local_sq_norms: list[float]  # |g_i|² of every rank
    global_sq_norm: float  # |g|² after synchronisation


def synchronize_gradients(
    params: Sequence[nn.Parameter],
    local_batch: int,
    global_batch: int,
    local_loss: float,
    rank: int,
    world: int,
) -> SyncResult:
    """All-reduce Σ (b_i/B)·g_i into every rank's .grad, plus the norms and loss riding along."""
    weight = local_batch / global_batch
    grads = flat_gradients(params)
    local_sq = float(grads.square().sum()) if local_batch > 0 else 0.0
    extras = torch.zeros(world + 1, dtype=grads.dtype)
    extras[rank] = local_sq
    extras[world] = local_loss * weight
    buffer = torch.cat([grads.mul_(weight), extras])
    if world > 1:
        dist.all_reduce(buffer)
    count = buffer.numel() - world - 1
    set_gradients_from_flat(params, buffer[:count])
    return SyncResult(
        loss=float(buffer[-1]),
        local_sq_norms=[float(x) for x in buffer[count : count + world]],
        global_sq_norm=float(buffer[:count].square().sum()),
    )


class DataStrategy:
    name = "data"

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

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        ctx.model.train()
        loss_sum = compute_sum = comm_sum = 0.0
        samples = steps = 0
        started = time.perf_counter()
        for step in ctx.sampler.epoch(position, plan.local_batches):
            t0 = time.perf_counter()
            watch = ctx.simulator.begin()
            local_batch = step.sizes[ctx.rank]
            for p in self.params:
                p.grad = None
            local_loss = 0.0
            if local_batch > 0:
                loss = forward_loss(ctx.model, ctx.loss_fn, fetch_batch(ctx.dataset, step.indices))
                loss.backward()
                local_loss = float(loss.detach())
            compute = ctx.simulator.finish(watch)
            sync_start = time.perf_counter()
            result = synchronize_gradients(
                self.params, local_batch, sum(step.sizes), local_loss, ctx.rank, ctx.world_size
            )
            comm = time.perf_counter() - sync_start
            ctx.optimizer.step()
            self.noise.update(estimate_noise(step.sizes, result.local_sq_norms, result.global_sq_norm))
            ctx.metrics.record_step(
                StepRecord(compute, sync_start - t0, comm, time.perf_counter() - t0, local_batch)
            )
            ctx.metrics.set_loss(result.loss)
            loss_sum += result.loss
            compute_sum += compute
            comm_sum += comm
            samples += local_batch
            steps += 1
        extra: dict[str, float] = {}
        estimate = self.noise.estimate
        if estimate is not None:
            extra["gradient_noise_scale"] = estimate.noise_scale
            ctx.metrics.set_noise_scale(estimate.noise_scale)
        return EpochStats(
            loss=loss_sum / max(steps, 1),
            samples=samples,
            steps=steps,
            compute_seconds=compute_sum,
            comm_seconds=comm_sum,
            wall_seconds=time.perf_counter() - started,
            extra=extra,
        )

    def evaluation_model(self) -> nn.Module:
        return self.ctx.model

    def state_dict(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state
