"""`esync`: local SGD rounds where each worker's number of local steps follows its speed.

Every round starts from the same global model w_t. A worker takes local steps until the state query
service answers READY (the slowest worker takes exactly one), then all workers all-reduce their
deltas Δ_i = w_i − w_t and set w_{t+1} = w_t + ϵ·mean(Δ). Each worker draws its own minibatches
from its own shuffle of the data; an epoch ends once the workers together have used as many samples
as the dataset holds.
"""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import ESyncParams, Plan
from hetero_runtime.esync_service import StateClient
from hetero_runtime.metrics import StepRecord
from hetero_runtime.sampler import SamplerPosition, epoch_order
from hetero_runtime.strategies.base import (
    EpochStats,
    StepTotals,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    calibrate_step,
    copy_from_flat,
    flat_parameters,
    forward_loss,
    synchronize,
    trainable,
)
from hetero_runtime.strategies.side_services import connect_state_service


class RoundTimedOut(RuntimeError):
    """A round's deltas were not averaged within roundTimeoutSeconds: a worker is lost or stalled."""


def average_deltas(buffer: torch.Tensor, world_size: int, round_index: int, seconds_left: float) -> None:
    """Sum `buffer` over the ranks, waiting at most `seconds_left`: past it the round has lost a worker,
    and this one stops with an error (its job restarts from the checkpoint) instead of waiting on."""
    if world_size == 1:
        return
    work = dist.all_reduce(buffer, async_op=True)
    try:
        work.wait(timeout=timedelta(seconds=max(seconds_left, 0.001)))
    except RuntimeError as err:
        raise RoundTimedOut(
            f"esync round {round_index} was not averaged within roundTimeoutSeconds: a worker is lost or "
            f"stalled ({err})"
        ) from err


def end_round(
    params: list[nn.Parameter],
    start: torch.Tensor,
    riders: list[float],
    config: ESyncParams,
    world_size: int,
    round_index: int,
    seconds_left: float,
) -> list[float]:
    """w ← w_start + ϵ·mean(Δ_i) in place, the same model on every rank; `riders` (numbers each rank
    adds) are summed over the ranks in the same all-reduce and returned."""
    with torch.no_grad():
        delta = flat_parameters(params) - start
        buffer = torch.cat([delta, delta.new_tensor(riders)])
        average_deltas(buffer, world_size, round_index, seconds_left)
        scale = config.global_learning_rate / world_size
        copy_from_flat(params, start + scale * buffer[: -len(riders)])
        return [float(x) for x in buffer[-len(riders) :].tolist()]


class OwnStream:
    """This worker's endless stream of minibatch indices for one epoch."""

    def __init__(self, dataset_size: int, seed: int, epoch: int, rank: int) -> None:
        self.order = epoch_order(dataset_size, seed * 1_000_003 + rank, epoch)
        self.offset = 0

    def take(self, count: int) -> np.ndarray:
        if self.offset + count > len(self.order):
            self.order = np.roll(self.order, -self.offset)
            self.offset = 0
        chosen = self.order[self.offset : self.offset + count]
        self.offset += count
        return chosen


class ESyncStrategy:
    name = "esync"
    symmetric = True

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.params = trainable(ctx.model)
        self.service: subprocess.Popen[bytes] | None = None
        self.client: StateClient | None = None
        self.params_config = ESyncParams()
        self.round = 0

    def start(self, plan: Plan) -> None:
        ctx = self.ctx
        if ctx.world_size > 1:
            broadcast_model(ctx.model)
        self.apply_plan(plan)
        self.service, self.client = connect_state_service(ctx.env, self.params_config)
        # RUN-BATCH-DATA-TEST: every worker reports a measured step time before the first round.
        local_batch = plan.local_batches[ctx.rank]
        batch = ctx.batch(np.arange(local_batch))
        watch = ctx.simulator.begin()
        ctx.amp.backward(forward_loss(ctx.model, ctx.loss_fn, batch, ctx.amp))
        ctx.optimizer.zero_grad(set_to_none=True)
        synchronize(ctx.device)
        self.client.query(
            ctx.rank, 0, ctx.simulator.finish(watch, ctx.full_speed_seconds("step", local_batch))
        )
        if ctx.world_size > 1:
            dist.barrier()

    def apply_plan(self, plan: Plan) -> None:
        self.params_config = plan.esync or ESyncParams()
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def calibrate(self, plan: Plan) -> dict[str, float]:
        return calibrate_step(self.ctx, plan.global_batch // plan.world_size, with_optimizer_step=True)

    def _local_steps(self, stream: OwnStream, local_batch: int) -> tuple[int, float, float]:
        """Local steps until the state service says READY: (steps, summed loss, compute seconds)."""
        ctx = self.ctx
        assert self.client is not None
        k, loss_sum, compute = 0, 0.0, 0.0
        step_seconds = 0.0
        # A worker at maxLocalSteps ends its round without asking; the service then waits for nobody.
        while k < self.params_config.max_local_steps and not self.client.query(ctx.rank, k, step_seconds):
            watch = ctx.simulator.begin()
            ctx.optimizer.zero_grad(set_to_none=True)
            loss = forward_loss(ctx.model, ctx.loss_fn, ctx.batch(stream.take(local_batch)), ctx.amp)
            loss.backward()
            ctx.optimizer.step()
            synchronize(ctx.device)
            step_seconds = ctx.simulator.finish(watch, ctx.full_speed_seconds("step", local_batch))
            k += 1
            loss_sum += float(loss.detach())
            compute += step_seconds
        return k, loss_sum, compute

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        assert self.client is not None
        ctx.model.train()
        dataset_size = ctx.sampler.dataset_size
        stream = OwnStream(dataset_size, ctx.env.seed, position.epoch, ctx.rank)
        local_batch = plan.local_batches[ctx.rank]
        consumed = position.consumed
        totals = StepTotals()
        round_steps: list[int] = []
        started = time.perf_counter()
        stopped_at = None
        while consumed < dataset_size:
            with torch.no_grad():
                start_weights = flat_parameters(self.params)
            round_started = time.perf_counter()
            k, round_loss, compute = self._local_steps(stream, local_batch)
            sync_start = time.perf_counter()
            stop = 1.0 if ctx.stop.requested() else 0.0
            seconds_left = self.params_config.round_timeout_seconds - (time.perf_counter() - round_started)
            round_samples, loss_total, stops = end_round(
                self.params,
                start_weights,
                [k * local_batch, round_loss / k, stop],
                self.params_config,
                ctx.world_size,
                self.round,
                seconds_left,
            )
            self.round += 1
            self.client.reset(ctx.rank, self.round)
            comm = time.perf_counter() - sync_start
            consumed += int(round_samples)
            ctx.metrics.record_step(
                StepRecord(
                    compute_seconds=sync_start - round_started,
                    sync_start_seconds=sync_start - round_started,
                    comm_seconds=comm,
                    step_seconds=time.perf_counter() - round_started,
                    local_batch=k * local_batch,
                )
            )
            ctx.metrics.set_local_steps(k)
            ctx.metrics.set_loss(loss_total / ctx.world_size)
            round_steps.append(k)
            totals.add(loss_total / ctx.world_size, compute, comm, k * local_batch, steps=k)
            if ctx.guard is not None:  # the round's loss, summed over the ranks: the same everywhere
                ctx.guard.record_shared_loss(loss_total / ctx.world_size, True, position.epoch)
            if stops > 0 and consumed < dataset_size:
                stopped_at = SamplerPosition(position.epoch, consumed)
                break
        extra = {
            "rounds": float(len(round_steps)),
            "mean_local_steps": float(np.mean(round_steps)) if round_steps else 0.0,
        }
        return totals.stats(time.perf_counter() - started, extra, stopped_at)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.service is not None:
            self.service.terminate()
            self.service.wait(timeout=10)

    def evaluation_model(self) -> nn.Module:
        return self.ctx.model

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state.get("round", 0))
