"""`dreamddp`: partial local SGD where each layer is averaged in its own phases of a period of H steps.

At start every rank profiles each layer's backward time and all-reduce time; the slowest rank's
times (max over ranks) go into the planner's DreamDDP schedule, unless the plan already carries
one. During backward, a per-parameter hook applies that parameter's optimizer step as soon as its
gradient is final, and once a whole layer is updated it launches the layer's averaging if the
layer is scheduled in this phase, so communication overlaps the rest of backward. Parameters are
averaged in place: no extra model copy. Every epoch ends with one full average.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import Plan
from hetero_operator.planner.dreamddp import phase_of_step, schedule
from hetero_runtime.metrics import StepRecord
from hetero_runtime.sampler import SamplerPosition
from hetero_runtime.strategies.base import (
    EpochStats,
    WorkerContext,
    apply_learning_rate_scale,
    average_model,
    broadcast_model,
    fetch_batch,
    forward_loss,
)

VERIFY_ENV = "HETEROTRAIN_VERIFY_INVARIANTS"
PROFILE_STEPS = 3


def layers_in_backward_order(model: nn.Module) -> list[nn.Module]:
    """Modules that own trainable parameters, output side first (reverse of registration order)."""
    owners = [m for m in model.modules() if any(p.requires_grad for p in m.parameters(recurse=False))]
    return list(reversed(owners))


def per_parameter_optimizers(optimizer: torch.optim.Optimizer) -> dict[nn.Parameter, torch.optim.Optimizer]:
    """One optimizer of the user's kind per parameter, with its group's settings (update inside backward)."""
    out: dict[nn.Parameter, torch.optim.Optimizer] = {}
    for group in optimizer.param_groups:
        settings = {key: value for key, value in group.items() if key != "params"}
        for param in group["params"]:
            out[param] = type(optimizer)([param], **settings)
    return out


class DreamDDPStrategy:
    name = "dreamddp"

    def __init__(self, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.layers = layers_in_backward_order(ctx.model)
        self.layer_params = [
            [p for p in layer.parameters(recurse=False) if p.requires_grad] for layer in self.layers
        ]
        self.optimizers = per_parameter_optimizers(ctx.optimizer)
        self.base_lrs = {p: float(o.param_groups[0]["lr"]) for p, o in self.optimizers.items()}
        self.layer_of = {p: index for index, params in enumerate(self.layer_params) for p in params}
        self.period = 1
        self.layer_phases: list[list[int]] = []
        self.global_step = 0
        self.verify = os.environ.get(VERIFY_ENV) == "1"
        self._phase = 0
        self._pending: dict[int, int] = {}
        self._handles: list[Any] = []
        self._synced: list[int] = []
        self._mark = ctx.simulator.begin()
        self._first_launch: float | None = None
        self._hook_action: Callable[[nn.Parameter], None] = self._train_hook
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.layer_of]

    # -- setup ---------------------------------------------------------------------------------
    def start(self, plan: Plan) -> None:
        if self.ctx.world_size > 1:
            broadcast_model(self.ctx.model)
        self.apply_plan(plan)

    def apply_plan(self, plan: Plan) -> None:
        assert plan.dreamddp is not None
        for param, optimizer in self.optimizers.items():
            optimizer.param_groups[0]["lr"] = self.base_lrs[param] * plan.learning_rate_scale
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)
        self.period = plan.dreamddp.period
        if plan.dreamddp.layer_phases is not None:
            if len(plan.dreamddp.layer_phases) != len(self.layers):
                raise ValueError(
                    f"dreamddp.layer_phases has {len(plan.dreamddp.layer_phases)} entries but the model has "
                    f"{len(self.layers)} layers with parameters"
                )
            self.layer_phases = [list(p) for p in plan.dreamddp.layer_phases]
        else:
            self.layer_phases = self._profiled_schedule(plan)

    def _profiled_schedule(self, plan: Plan) -> list[list[int]]:
        """Profile layer times, take the slowest rank's, and ask the planner for the schedule."""
        ctx = self.ctx
        batch = fetch_batch(ctx.dataset, torch.arange(max(1, plan.local_batches[ctx.rank])).numpy())
        backward = torch.zeros(len(self.layers), dtype=torch.float64)
        forward = 0.0
        ends: dict[int, float] = {}
        self._hook_action = lambda p: self._profile_hook(p, ends)
        for _ in range(PROFILE_STEPS):
            self._pending = {i: len(params) for i, params in enumerate(self.layer_params)}
            watch = ctx.simulator.begin()
            loss = forward_loss(ctx.model, ctx.loss_fn, batch)
            forward += ctx.simulator.finish(watch)
            self._mark = ctx.simulator.begin()
            start = self._mark.wall
            loss.backward()
            previous = start
            for index in range(len(self.layers)):
                backward[index] += ends[index] - previous
                previous = ends[index]
        self._hook_action = self._train_hook
        comm = torch.zeros(len(self.layers), dtype=torch.float64)
        for index, params in enumerate(self.layer_params):
            flat = torch.cat([p.data.reshape(-1) for p in params])
            t0 = time.perf_counter()
            for _ in range(PROFILE_STEPS):
                if ctx.world_size > 1:
                    dist.all_reduce(flat.clone())
            comm[index] = (time.perf_counter() - t0) / PROFILE_STEPS
        times = torch.cat(
            [backward / PROFILE_STEPS, comm, torch.tensor([forward / PROFILE_STEPS], dtype=torch.float64)]
        )
        if ctx.world_size > 1:
            dist.all_reduce(times, op=dist.ReduceOp.MAX)  # collectives wait for the slowest rank
        ms = (times * 1000.0).tolist()
        count = len(self.layers)
        plan_of = schedule(self.period, ms[-1], ms[:count], ms[count : 2 * count])
        phases = plan_of.phases_of_layer()
        return [phases.get(index, [0]) for index in range(count)]

    # -- hooks ---------------------------------------------------------------------------------
    def _on_grad(self, param: nn.Parameter) -> None:
        self._hook_action(param)

    def _profile_hook(self, param: nn.Parameter, ends: dict[int, float]) -> None:
        layer = self.layer_of[param]
        param.grad = None
        self._pending[layer] -= 1
        if self._pending[layer] == 0:
            self.ctx.simulator.finish(self._mark)
            self._mark = self.ctx.simulator.begin()
            ends[layer] = self._mark.wall

    def _train_hook(self, param: nn.Parameter) -> None:
        layer = self.layer_of[param]
        self.optimizers[param].step()  # update inside backward: the averaged values are post-update
        param.grad = None
        self._pending[layer] -= 1
        if self._pending[layer] > 0:
            return
        self.ctx.simulator.finish(self._mark)
        self._mark = self.ctx.simulator.begin()
        if self._phase in self.layer_phases[layer] and self.ctx.world_size > 1:
            if self._first_launch is None:
                self._first_launch = self._mark.wall
            for p in self.layer_params[layer]:  # fixed order on every rank
                self._handles.append(dist.all_reduce(p.data, async_op=True))
            self._synced.append(layer)

    # -- training ------------------------------------------------------------------------------
    def _layers_identical(self, layers: list[int]) -> int:
        """How many of `layers` differ anywhere across ranks (max == min elementwise otherwise)."""
        differing = 0
        for layer in layers:
            flat = torch.cat([p.data.reshape(-1) for p in self.layer_params[layer]])
            high, low = flat.clone(), flat.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            differing += int(not torch.equal(high, low))
        return differing

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        ctx.model.train()
        loss_sum = compute_sum = comm_sum = 0.0
        samples = steps = checks = differing = 0
        started = time.perf_counter()
        for step in ctx.sampler.epoch(position, plan.local_batches):
            t0 = time.perf_counter()
            local_batch = step.sizes[ctx.rank]
            self._phase = phase_of_step(self.global_step, self.period)
            self._pending = {i: len(params) for i, params in enumerate(self.layer_params)}
            self._handles, self._synced, self._first_launch = [], [], None
            watch = ctx.simulator.begin()
            loss = forward_loss(ctx.model, ctx.loss_fn, fetch_batch(ctx.dataset, step.indices))
            ctx.simulator.finish(watch)
            self._mark = ctx.simulator.begin()
            loss.backward()
            backward_done = time.perf_counter()
            with torch.no_grad():
                for handle in self._handles:
                    handle.wait()
                for layer in self._synced:
                    for p in self.layer_params[layer]:
                        p.data.div_(ctx.world_size)
            if self.verify and ctx.world_size > 1:
                checks += len(self._synced)
                differing += self._layers_identical(self._synced)
            end = time.perf_counter()
            compute, comm = backward_done - t0, end - backward_done
            sync_start = (self._first_launch or backward_done) - t0
            ctx.metrics.record_step(StepRecord(compute, sync_start, comm, end - t0, local_batch))
            ctx.metrics.set_loss(float(loss.detach()))
            self.global_step += 1
            loss_sum += float(loss.detach())
            compute_sum += compute
            comm_sum += comm
            samples += local_batch
            steps += 1
        average_model(ctx.model, ctx.world_size)
        extra: dict[str, float] = {"period": float(self.period)}
        if self.verify:
            extra |= {"layer_checks": float(checks), "layers_not_identical_after_phase": float(differing)}
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
        return {
            "global_step": self.global_step,
            "optimizers": [self.optimizers[p].state_dict() for p in self.layer_of],
            "layer_phases": self.layer_phases,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.global_step = int(state.get("global_step", 0))
        for param, saved in zip(self.layer_of, state.get("optimizers", []), strict=False):
            self.optimizers[param].load_state_dict(saved)

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
