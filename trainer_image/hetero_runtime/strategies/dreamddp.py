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

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import Plan
from hetero_operator.planner.dreamddp import phase_of_step, schedule
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
    flat_parameters,
    forward_loss,
    preserved_state,
    synchronize,
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
    symmetric = True

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
        self._layer_costs: list[float] = []
        self._samples = 0
        self._work_done = 0.0
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

    def _measure_layers(self, samples: int) -> tuple[float, list[float]]:
        """Real (unstretched) seconds of the forward pass and of each layer's backward, averaged over
        PROFILE_STEPS; nothing is updated (the profile hook drops the gradients)."""
        ctx = self.ctx
        batch = ctx.batch(np.arange(min(max(1, samples), ctx.sampler.dataset_size)))
        backward = [0.0] * len(self.layers)
        forward = 0.0
        ends: dict[int, float] = {}
        self._hook_action = lambda p: self._profile_hook(p, ends)
        try:
            for _ in range(PROFILE_STEPS):
                self._pending = {i: len(params) for i, params in enumerate(self.layer_params)}
                start = time.perf_counter()
                loss = forward_loss(ctx.model, ctx.loss_fn, batch, ctx.amp)
                synchronize(ctx.device)
                previous = time.perf_counter()
                forward += previous - start
                loss.backward()
                for index in range(len(self.layers)):
                    backward[index] += ends[index] - previous
                    previous = ends[index]
        finally:
            self._hook_action = self._train_hook
        return forward / PROFILE_STEPS, [t / PROFILE_STEPS for t in backward]

    def calibrate(self, plan: Plan) -> dict[str, float]:
        samples = max(1, plan.global_batch // plan.world_size)
        with preserved_state(self.ctx.model):
            self._measure_layers(samples)  # warm-up
            forward, backward = self._measure_layers(samples)
        costs = {"forward": forward / samples}
        costs.update({f"layer{i}": t / samples for i, t in enumerate(backward)})
        return costs

    def _step_costs(self) -> tuple[float, list[float]]:
        """Per-sample seconds of the forward pass and of each layer's backward on the base device."""
        costs = self.ctx.costs
        return costs.get("forward", 0.0), [costs.get(f"layer{i}", 0.0) for i in range(len(self.layers))]

    def _profiled_schedule(self, plan: Plan) -> list[list[int]]:
        """Profile layer times, take the slowest rank's, and ask the planner for the schedule. A
        simulated GPU's times are its calibrated ones at its simulated speed."""
        ctx = self.ctx
        samples = max(1, plan.local_batches[ctx.rank])
        if ctx.simulator.active and ctx.costs:
            forward, backward = self._step_costs()
            scale = samples / ctx.simulator.speed
            forward, backward = forward * scale, [t * scale for t in backward]
        else:
            forward, backward = self._measure_layers(samples)
        comm = []
        for params in self.layer_params:
            flat = flat_parameters(params)
            t0 = time.perf_counter()
            for _ in range(PROFILE_STEPS):
                if ctx.world_size > 1:
                    dist.all_reduce(flat.clone())
            synchronize(ctx.device)
            comm.append((time.perf_counter() - t0) / PROFILE_STEPS)
        times = torch.tensor([*backward, *comm, forward], dtype=torch.float64, device=ctx.device)
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
            synchronize(self.ctx.device)
            ends[layer] = time.perf_counter()

    def _train_hook(self, param: nn.Parameter) -> None:
        layer = self.layer_of[param]
        self.optimizers[param].step()  # update inside backward: the averaged values are post-update
        param.grad = None
        self._pending[layer] -= 1
        if self._pending[layer] > 0:
            return
        # The layer's backward is done: on a simulated GPU it ends at its calibrated share of the step.
        self._work_done += self._layer_costs[layer] * self._samples
        if self.ctx.simulator.active:
            synchronize(self.ctx.device)
            self.ctx.simulator.pace(self._mark, self._work_done)
        if self._phase in self.layer_phases[layer] and self.ctx.world_size > 1:
            if self._first_launch is None:
                self._first_launch = time.perf_counter()
            for p in self.layer_params[layer]:  # fixed order on every rank
                self._handles.append(dist.all_reduce(p.data, async_op=True))
            self._synced.append(layer)

    # -- training ------------------------------------------------------------------------------
    def _layers_identical(self, layers: list[int]) -> int:
        """How many of `layers` differ anywhere across ranks (max == min elementwise otherwise)."""
        differing = 0
        for layer in layers:
            flat = flat_parameters(self.layer_params[layer])
            high, low = flat.clone(), flat.clone()
            dist.all_reduce(high, op=dist.ReduceOp.MAX)
            dist.all_reduce(low, op=dist.ReduceOp.MIN)
            differing += int(not torch.equal(high, low))
        return differing

    def _step(self, indices: np.ndarray, local_batch: int) -> tuple[float, float]:
        """Forward, then backward with each layer updated (and averaged in its phase) as it
        finishes; (loss, seconds until backward ended, stretched on a simulated GPU)."""
        ctx = self.ctx
        self._pending = {i: len(params) for i, params in enumerate(self.layer_params)}
        self._handles, self._synced, self._first_launch = [], [], None
        forward_cost, self._layer_costs = self._step_costs()
        self._samples, self._work_done = local_batch, forward_cost * local_batch
        self._mark = ctx.simulator.begin()
        loss = forward_loss(ctx.model, ctx.loss_fn, ctx.batch(indices), ctx.amp)
        if ctx.simulator.active:
            synchronize(ctx.device)
            ctx.simulator.pace(self._mark, self._work_done)
        loss.backward()
        synchronize(ctx.device)
        compute = ctx.simulator.finish(self._mark, self._work_done)
        return float(loss.detach()), compute

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx = self.ctx
        ctx.model.train()
        totals = StepTotals()
        vote = LaggedVote(ctx.world_size, ctx.device)
        checks = differing = 0
        started = time.perf_counter()
        stopped_at = None
        for step in ctx.sampler.epoch(position, plan.local_batches):
            t0 = time.perf_counter()
            local_batch = step.sizes[ctx.rank]
            self._phase = phase_of_step(self.global_step, self.period)
            loss, compute = self._step(step.indices, local_batch)
            backward_done = t0 + compute
            with torch.no_grad():
                for handle in self._handles:
                    handle.wait()
                for layer in self._synced:
                    for p in self.layer_params[layer]:
                        p.data.div_(ctx.world_size)
            if self.verify and ctx.world_size > 1:
                checks += len(self._synced)
                differing += self._layers_identical(self._synced)
            stop = vote.cast(ctx.stop.requested())
            end = time.perf_counter()
            sync_start = (self._first_launch or backward_done) - t0
            ctx.metrics.record_step(
                StepRecord(compute, sync_start, end - backward_done, end - t0, local_batch)
            )
            ctx.metrics.set_loss(loss)
            self.global_step += 1
            totals.add(loss, compute, end - backward_done, local_batch)
            if ctx.guard is not None:
                ctx.guard.record_loss(loss)
                ctx.guard.after_step(position.epoch, compare=False)  # layers differ until their phase
            if stop:
                stopped_at = step.position_after
                break
        vote.settle()
        average_model(ctx.model, ctx.world_size)
        extra: dict[str, float] = {"period": float(self.period)}
        if self.verify:
            extra |= {"layer_checks": float(checks), "layers_not_identical_after_phase": float(differing)}
        return totals.stats(time.perf_counter() - started, extra, stopped_at)

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
