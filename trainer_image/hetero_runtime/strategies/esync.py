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
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import ESyncParams, Plan
from hetero_runtime.esync_service import StateClient, start_service_process
from hetero_runtime.metrics import StepRecord
from hetero_runtime.sampler import SamplerPosition, epoch_order
from hetero_runtime.strategies.base import (
    EpochStats,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    copy_from_flat,
    fetch_batch,
    forward_loss,
    trainable,
)


class _OwnStream:
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
        port = self.params_config.state_service_port or ctx.env.master_port + 1
        if ctx.rank == 0:
            self.service = start_service_process(port, ctx.world_size, self.params_config.margin_seconds)
        self.client = StateClient(ctx.env.master_addr, port)
        # RUN-BATCH-DATA-TEST: every worker reports a measured step time before the first round.
        batch = fetch_batch(ctx.dataset, np.arange(plan.local_batches[ctx.rank]))
        watch = ctx.simulator.begin()
        forward_loss(ctx.model, ctx.loss_fn, batch).backward()
        ctx.optimizer.zero_grad(set_to_none=True)
        self.client.query(ctx.rank, 0, ctx.simulator.finish(watch))
        if ctx.world_size > 1:
            dist.barrier()

    def apply_plan(self, plan: Plan) -> None:
        self.params_config = plan.esync or ESyncParams()
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        assert self.client is not None
        ctx.model.train()
        dataset_size = ctx.sampler.dataset_size
        stream = _OwnStream(dataset_size, ctx.env.seed, position.epoch, ctx.rank)
        local_batch = plan.local_batches[ctx.rank]
        consumed = position.consumed
        loss_sum = compute_sum = comm_sum = 0.0
        samples = steps = rounds = 0
        round_steps: list[int] = []
        started = time.perf_counter()
        while consumed < dataset_size:
            with torch.no_grad():
                start_weights = torch.cat([p.data.reshape(-1) for p in self.params])
            k, round_samples, round_loss = 0, 0, 0.0
            round_started = time.perf_counter()
            step_seconds = 0.0
            while not self.client.query(ctx.rank, k, step_seconds):
                watch = ctx.simulator.begin()
                ctx.optimizer.zero_grad(set_to_none=True)
                loss = forward_loss(
                    ctx.model, ctx.loss_fn, fetch_batch(ctx.dataset, stream.take(local_batch))
                )
                loss.backward()
                ctx.optimizer.step()
                step_seconds = ctx.simulator.finish(watch)
                k += 1
                round_samples += local_batch
                round_loss += float(loss.detach())
                compute_sum += step_seconds
            sync_start = time.perf_counter()
            with torch.no_grad():
                delta = torch.cat([p.data.reshape(-1) for p in self.params]) - start_weights
                buffer = torch.cat([delta, delta.new_tensor([round_samples, round_loss / k])])
                if ctx.world_size > 1:
                    dist.all_reduce(buffer)
                scale = self.params_config.global_learning_rate / ctx.world_size
                copy_from_flat(self.params, start_weights + scale * buffer[:-2])
            self.round += 1
            self.client.reset(ctx.rank, self.round)
            comm = time.perf_counter() - sync_start
            consumed += int(buffer[-2])
            ctx.metrics.record_step(
                StepRecord(
                    compute_seconds=sync_start - round_started,
                    sync_start_seconds=sync_start - round_started,
                    comm_seconds=comm,
                    step_seconds=time.perf_counter() - round_started,
                    local_batch=round_samples,
                )
            )
            ctx.metrics.set_local_steps(k)
            ctx.metrics.set_loss(float(buffer[-1]) / ctx.world_size)
            round_steps.append(k)
            loss_sum += float(buffer[-1]) / ctx.world_size
            comm_sum += comm
            samples += round_samples
            steps += k
            rounds += 1
        return EpochStats(
            loss=loss_sum / max(rounds, 1),
            samples=samples,
            steps=steps,
            compute_seconds=compute_sum,
            comm_seconds=comm_sum,
            wall_seconds=time.perf_counter() - started,
            extra={
                "rounds": float(rounds),
                "mean_local_steps": float(np.mean(round_steps)) if round_steps else 0.0,
            },
        )

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
