"""`sesgd`: one local step, then the updated parameters are averaged inside shuffled groups.

Groups change every step and come from the planner's shared-seed schedule, so no rank ever sends a
coordination message; the in-group average is a ring over point-to-point ops. Averaging parameters
(not gradients) keeps each step's between-group differences in the local models. The averages are
weighted by samples (a replica that trained on 40 samples counts four times one that trained on 10),
so the sample-weighted mean of the replicas moves by the mean gradient over the global batch, as one
process on that batch would; the paper's plain mean assumes equal local batches. At each epoch end all
replicas are averaged once, by the plan's local batches, so that evaluation, checkpoints and plan
changes see one model.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import Plan
from hetero_operator.planner.sesgd import group_schedule
from hetero_runtime.metrics import StepRecord
from hetero_runtime.sampler import SamplerPosition
from hetero_runtime.stopping import LaggedVote
from hetero_runtime.strategies.base import (
    EpochStats,
    StepTotals,
    WorkerContext,
    apply_learning_rate_scale,
    average_model,
    broadcast_model,
    calibrate_step,
    copy_from_flat,
    flat_parameters,
    forward_loss,
    synchronize,
    trainable,
)
from hetero_runtime.strategies.group_ring import weighted_group_mean

VERIFY_ENV = "HETEROTRAIN_VERIFY_INVARIANTS"


class GroupSchedule:
    """Step -> groups, extending the planner's deterministic schedule as training goes on."""

    def __init__(self, world: int, groups: int, seed: int) -> None:
        self.world, self.groups, self.seed = world, groups, seed
        self._steps: list[list[list[int]]] = []

    def groups_at(self, step: int) -> list[list[int]]:
        if step >= len(self._steps):
            self._steps = group_schedule(self.world, self.groups, self.seed, max(2 * step, 64))
        return self._steps[step]

    def members_of(self, step: int, rank: int) -> list[int]:
        return next(group for group in self.groups_at(step) if rank in group)


class SESGDStrategy:
    name = "sesgd"
    symmetric = True

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.params = trainable(ctx.model)
        self.global_step = 0
        self.schedule: GroupSchedule | None = None
        self.verify = os.environ.get(VERIFY_ENV) == "1"

    def start(self, plan: Plan) -> None:
        if self.ctx.world_size > 1:
            broadcast_model(self.ctx.model)
        self.apply_plan(plan)

    def apply_plan(self, plan: Plan) -> None:
        assert plan.sesgd is not None
        self.schedule = GroupSchedule(plan.world_size, plan.sesgd.groups, plan.sesgd.seed)
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def _average_in_group(self, members: list[int], sizes: list[int]) -> float:
        """Replace the parameters by their group's sample-weighted mean; returns the relative change
        of Σ_ranks b_i·params when verifying (0 up to rounding when every rank has samples)."""
        with torch.no_grad():
            flat = flat_parameters(self.params)
            own = sizes[self.ctx.rank]
            before = self._world_sum(flat * own) if self.verify else None
            weighted_group_mean(flat, members, self.ctx.rank, sizes)
            copy_from_flat(self.params, flat)
            if before is None:
                return 0.0
            after = self._world_sum(flat * own)
            return float((after - before).abs().max() / before.abs().max().clamp_min(1e-12))

    def _world_sum(self, flat: torch.Tensor) -> torch.Tensor:
        total = flat.to(torch.float64)
        dist.all_reduce(total)
        return total

    def calibrate(self, plan: Plan) -> dict[str, float]:
        return calibrate_step(self.ctx, plan.global_batch // plan.world_size, with_optimizer_step=True)

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        assert self.schedule is not None
        ctx.model.train()
        totals = StepTotals()
        vote = LaggedVote(ctx.world_size, ctx.device)
        worst_mean_drift = 0.0
        started = time.perf_counter()
        stopped_at = None
        for step in ctx.sampler.epoch(position, plan.local_batches):
            t0 = time.perf_counter()
            watch = ctx.simulator.begin()
            local_batch = step.sizes[ctx.rank]
            ctx.optimizer.zero_grad(set_to_none=True)
            loss = forward_loss(ctx.model, ctx.loss_fn, ctx.batch(step.indices), ctx.amp)
            loss.backward()
            ctx.optimizer.step()  # x̂ = x − η∇f(x): the local step comes before the averaging
            synchronize(ctx.device)
            compute = ctx.simulator.finish(watch, ctx.full_speed_seconds("step", local_batch))
            sync_start = time.perf_counter()
            if ctx.world_size > 1:
                members = self.schedule.members_of(self.global_step, ctx.rank)
                worst_mean_drift = max(worst_mean_drift, self._average_in_group(members, step.sizes))
            stop = vote.cast(ctx.stop.requested())
            comm = time.perf_counter() - sync_start
            self.global_step += 1
            ctx.metrics.record_step(
                StepRecord(compute, sync_start - t0, comm, time.perf_counter() - t0, local_batch)
            )
            step_loss = float(loss.detach())
            ctx.metrics.set_loss(step_loss)
            totals.add(step_loss, compute, comm, local_batch)
            if ctx.guard is not None:
                ctx.guard.record_loss(step_loss)
                ctx.guard.after_step(position.epoch, compare=False)  # groups differ until the epoch ends
            if stop:
                stopped_at = step.position_after
                break
        vote.settle()
        average_model(ctx.model, ctx.world_size, plan.local_batches[ctx.rank] / plan.global_batch)
        extra = {"relative_mean_drift": worst_mean_drift} if self.verify else {}
        return totals.stats(time.perf_counter() - started, extra, stopped_at)

    def evaluation_model(self) -> nn.Module:
        return self.ctx.model

    def state_dict(self) -> dict[str, Any]:
        return {"global_step": self.global_step}

    def close(self) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state.get("global_step", 0))
