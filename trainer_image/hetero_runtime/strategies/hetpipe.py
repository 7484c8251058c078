"""`hetpipe`: pipelines of ranks (virtual workers) trained data-parallel under Wave Synchronous Parallel.

Inside a virtual worker (VW) the model's layers (an nn.Sequential given as the job option
`layers`) are cut into stages at the plan's boundaries, one rank per stage. A wave is Nm minibatches:
all of them go forward through the stages (activations sent point to point), then backward in the
same order (input gradients sent back); the last stage runs each minibatch's forward and backward as
one task. Every minibatch of a wave uses the weights pulled before the wave, so minibatch p always
sees all local updates up to p − Nm. After the wave each stage pushes its summed update to the
parameter server and the next wave's pull waits until the global clock allows it: minibatch p may
start only when every VW has pushed waves up to ⌊p/Nm⌋ − 2 − D (the WSP gate, from the planner).

Simplification: a VW starts a wave only after the previous one completed (waves do not overlap),
and waiting for the parameter server does not overlap the pipeline.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import HetPipeParams, Plan
from hetero_operator.planner.wsp import may_start, required_global_clock
from hetero_runtime.calibration import calibrate_solo, common_costs
from hetero_runtime.device import model_device
from hetero_runtime.hetpipe_ps import ParameterServerClient
from hetero_runtime.layer_costs import base_device_factor, measure_layer_costs
from hetero_runtime.metrics import StepRecord
from hetero_runtime.precision import MixedPrecision
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.simulate import SpeedSimulator, per_sample_seconds
from hetero_runtime.strategies.base import (
    EpochStats,
    LossFn,
    StepTotals,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    preserved_state,
    synchronize,
)
from hetero_runtime.strategies.hetpipe_layout import StagePlace, place_of, same_pipelines
from hetero_runtime.strategies.side_services import connect_parameter_server

log = logging.getLogger(__name__)
# Rounds of turns in which every rank times the layers (each layer keeps its fastest time).
LAYER_COST_ROUNDS = 3

VERIFY_ENV = "HETEROTRAIN_VERIFY_INVARIANTS"
STAGE_COSTS_LOG = "stage costs on the simulated base device (us per sample):"
"""Logged, then `segment=cost` pairs, whenever a rank's stage is (re)calibrated: what its compute is
paced against (cost / its speed)."""
_MAX_DIMS = 8
# Activations travel in the dtype autocast gave them (bf16 under mixed precision).
_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def send_activation(tensor: torch.Tensor, to_rank: int, keep: list[Any]) -> None:
    """Non-blocking send of a header (shape, dtype) and the data, on the tensor's device (kept alive
    in `keep` until waited)."""
    header = torch.zeros(_MAX_DIMS + 2, dtype=torch.long, device=tensor.device)
    header[0] = tensor.dim()
    header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape, device=tensor.device)
    header[-1] = _DTYPES.index(tensor.dtype)
    payload = tensor.detach().contiguous()
    keep.extend([dist.isend(header, to_rank), dist.isend(payload, to_rank), header, payload])


def receive_activation(from_rank: int, device: torch.device) -> torch.Tensor:
    header = torch.empty(_MAX_DIMS + 2, dtype=torch.long, device=device)
    dist.recv(header, from_rank)
    values = header.tolist()
    payload = torch.empty(values[1 : 1 + values[0]], dtype=_DTYPES[values[-1]], device=device)
    dist.recv(payload, from_rank)
    return payload


def wait_all(keep: list[Any]) -> None:
    for item in keep:
        if hasattr(item, "wait"):
            item.wait()
    keep.clear()


class PipelineStage:
    """One rank's slice of the model and its part of a wave's forward and backward passes."""

    def __init__(
        self,
        layers: nn.Sequential,
        place: StagePlace,
        loss_fn: LossFn,
        simulator: SpeedSimulator,
        amp: MixedPrecision | None = None,
    ) -> None:
        self.loss_fn = loss_fn
        self.simulator = simulator
        self.amp = amp
        self.place = place
        self.module = nn.Sequential(*list(layers)[place.first_layer : place.end_layer])
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.device = model_device(layers)
        self.costs: dict[str, float] = {}  # per-sample seconds of "forward" and "backward" (calibrated)

    @property
    def is_last(self) -> bool:
        return self.place.next_rank is None

    def _forward(self, x: torch.Tensor, targets: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This stage's output and, on the last stage, the backpropagated loss."""
        context = self.amp.autocast() if self.amp is not None else contextlib.nullcontext()
        with context:
            out = self.module(x)
            loss = self.loss_fn(out, targets) if self.is_last else None
        if loss is not None:
            loss.backward()
        return out, loss

    def run_wave(self, batches: list[Any]) -> tuple[float, float]:
        """Forward and backward of every minibatch of a wave; gradients accumulate over the wave.

        `batches` holds each minibatch's (inputs, targets) where this stage needs them (the first
        stage reads inputs, the last reads targets). Returns (summed loss, compute seconds).
        """
        keep: list[Any] = []
        pending: list[tuple[torch.Tensor, torch.Tensor, int]] = []
        loss_total = compute = 0.0
        for inputs, targets in batches:
            samples = len(targets)
            if self.place.previous_rank is None:
                x = inputs
            else:
                x = receive_activation(self.place.previous_rank, self.device).requires_grad_()
            watch = self.simulator.begin()
            out, loss = self._forward(x, targets)
            synchronize(self.device)
            segment = "forward_backward" if self.is_last else "forward"
            compute += self.simulator.finish(watch, self.costs.get(segment, 0.0) * samples)
            if loss is not None:
                loss_total += float(loss.detach())
                if self.place.previous_rank is not None:
                    assert x.grad is not None
                    keep.extend([dist.isend(x.grad.contiguous(), self.place.previous_rank), x.grad])
            else:
                assert self.place.next_rank is not None
                send_activation(out, self.place.next_rank, keep)
                pending.append((x, out, samples))
        for x, out, samples in pending:  # backward in minibatch order (FIFO)
            assert self.place.next_rank is not None
            grad = torch.empty_like(out)
            dist.recv(grad, self.place.next_rank)
            watch = self.simulator.begin()
            out.backward(grad)
            synchronize(self.device)
            compute += self.simulator.finish(watch, self.costs.get("backward", 0.0) * samples)
            if self.place.previous_rank is not None:
                assert x.grad is not None
                keep.extend([dist.isend(x.grad.contiguous(), self.place.previous_rank), x.grad])
        wait_all(keep)
        return loss_total, compute

    def calibrate(self, layers: nn.Sequential, batch: Any) -> dict[str, float]:
        """Per-sample seconds of this stage's forward and backward, on inputs made locally by the
        layers before it (no other rank computes meanwhile)."""
        inputs, targets = batch
        with torch.no_grad():
            x = (
                nn.Sequential(*list(layers)[: self.place.first_layer])(inputs)
                if self.place.first_layer
                else inputs
            )
        samples = len(targets)
        x = x.detach().requires_grad_(self.place.previous_rank is not None)
        if self.is_last:
            return {"forward_backward": per_sample_seconds(lambda: self._timed_forward(x, targets), samples)}
        grad = torch.ones_like(self._forward(x, targets)[0])
        forward = per_sample_seconds(lambda: self._timed_forward(x, targets), samples)
        backward = per_sample_seconds(lambda: self._timed_backward(x, targets, grad), samples)
        return {"forward": forward, "backward": max(backward - forward, 0.0)}

    def _timed_forward(self, x: torch.Tensor, targets: Any) -> None:
        """A forward pass (and the loss's backward, on the last stage)."""
        self._forward(x, targets)
        synchronize(self.device)

    def _timed_backward(self, x: torch.Tensor, targets: Any, grad: torch.Tensor) -> None:
        """Forward then backward (a backward needs its graph); the forward's time is taken off later."""
        out, _ = self._forward(x, targets)
        out.backward(grad)
        synchronize(self.device)


class HetPipeStrategy:
    name = "hetpipe"
    symmetric = False  # each stage calibrates its own slice of the model

    def __init__(self, ctx: WorkerContext, options: dict[str, Any]) -> None:
        layers = options.get("layers")
        if not isinstance(layers, nn.Sequential):
            raise ValueError(
                "hetpipe needs the job option 'layers': the model as an nn.Sequential to cut into stages"
            )
        self.ctx = ctx
        self.layers = layers
        self.names = {p: name for name, p in layers.named_parameters()}
        self.stage: PipelineStage | None = None
        self.params: HetPipeParams | None = None
        self.client: ParameterServerClient | None = None
        self.server: subprocess.Popen[bytes] | None = None
        self.minibatches_done = 0  # completed minibatches of this VW (global numbering p = done + 1)
        self.waves_done = 0
        self.verify = os.environ.get(VERIFY_ENV) == "1"
        self.trace: list[dict[str, int]] = []
        # Per-sample seconds of each layer on this rank's own device and on the simulated base device.
        self.own_layer_costs: list[float] = []
        self.base_layer_costs: list[float] = []

    def _place(self, plan: Plan) -> PipelineStage:
        if self.stage is None:
            assert plan.hetpipe is not None
            self.params = plan.hetpipe
            place = place_of(plan.hetpipe, self.ctx.rank, len(self.layers))
            self.stage = PipelineStage(self.layers, place, self.ctx.loss_fn, self.ctx.simulator, self.ctx.amp)
        return self.stage

    def calibrate(self, plan: Plan) -> dict[str, float]:
        stage = self._place(plan)
        samples = max(1, max(plan.local_batches))
        batch = self.ctx.batch(np.arange(min(samples, self.ctx.sampler.dataset_size)))
        with preserved_state(self.layers):
            return stage.calibrate(self.layers, batch)

    def start(self, plan: Plan) -> None:
        ctx = self.ctx
        stage = self._place(plan)
        assert self.params is not None
        apply_learning_rate_scale(ctx, plan.learning_rate_scale)
        if ctx.world_size > 1:
            broadcast_model(self.layers)
        self._report_layer_costs(plan)
        self._on_base_device(stage)
        self.server, self.client = connect_parameter_server(ctx, self.params)
        if ctx.rank == 0:
            self.client.initialize({name: host_copy(p) for p, name in self.names.items()})
        if ctx.world_size > 1:
            dist.barrier()

    def _report_layer_costs(self, plan: Plan) -> None:
        """Every rank times each layer of the whole model on its own device, in turn (solo, so no
        figure holds another rank's load), and exports them for the operator's stage cuts. The turns
        go round LAYER_COST_ROUNDS times and each layer keeps its fastest, so a burst of other work
        on the host during one turn does not count (a slowness that lasts through every turn still
        does). A simulated GPU is a fraction of the base device, as in every strategy's calibration:
        the simulated ranks' costs are each layer's highest over them, divided by the rank's speed."""
        ctx = self.ctx
        samples = max(1, max(plan.local_batches))
        inputs, targets = ctx.batch(np.arange(min(samples, ctx.sampler.dataset_size)))
        own: list[float] = []
        for _ in range(LAYER_COST_ROUNDS):
            for turn in range(ctx.world_size):
                if ctx.world_size > 1:
                    dist.barrier()
                if ctx.rank == turn:
                    timed = measure_layer_costs(self.layers, inputs, targets, ctx.loss_fn)
                    own = [min(a, b) for a, b in zip(own, timed, strict=True)] if own else timed
        self.own_layer_costs, self.base_layer_costs = own, self._base_device(own)
        speed = ctx.simulator.speed if ctx.simulator.active else 1.0
        costs = [cost / speed for cost in self.base_layer_costs]
        ctx.metrics.set_layer_costs(costs)
        log.info("layer costs: %s us per sample", ", ".join(f"{c * 1e6:.1f}" for c in costs))

    def _base_device(self, own: list[float]) -> list[float]:
        """Each layer's cost on the simulated base device: the highest over the simulated ranks (the
        collective runs on every rank, a real device's adding nothing); a real device's are its own."""
        ctx = self.ctx
        if ctx.world_size == 1:
            return own
        simulated = ctx.simulator.active
        keys = [f"{layer:06d}" for layer in range(len(own))]
        highest = common_costs(
            {key: cost if simulated else 0.0 for key, cost in zip(keys, own, strict=True)}, ctx.device
        )
        return [highest[key] for key in keys] if simulated else own

    def _on_base_device(self, stage: PipelineStage) -> None:
        """The stage's calibrated costs, stretched from this rank's own device to the base device over
        the stage's layers (a simulated rank on a slower core of the host runs as fast as the rest)."""
        ctx = self.ctx
        if ctx.simulator.active and self.own_layer_costs:
            span = slice(stage.place.first_layer, stage.place.end_layer)
            factor = base_device_factor(self.own_layer_costs[span], self.base_layer_costs[span])
            ctx.costs = {segment: cost * factor for segment, cost in ctx.costs.items()}
        stage.costs = dict(ctx.costs)
        if ctx.simulator.active:
            costs = " ".join(f"{segment}={cost * 1e6:.3f}" for segment, cost in sorted(stage.costs.items()))
            log.info("%s %s", STAGE_COSTS_LOG, costs)

    def apply_plan(self, plan: Plan) -> None:
        new, old = plan.hetpipe, self.params
        if new != old:
            if new is None or old is None or not same_pipelines(new, old):
                raise ValueError(
                    "a new hetpipe layout of other virtual workers needs a restart from checkpoint"
                )
            self._recut(plan)
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def _recut(self, plan: Plan) -> None:
        """New stage boundaries, same pipelines: at an epoch boundary every rank holds the whole global
        model (pulled after the last wave), so each takes its new slice of it; the simulated base
        device is calibrated again for the new slices. The optimizer's state of a layer that changes
        rank starts afresh on its new rank."""
        self.stage = None
        stage = self._place(plan)
        if self.ctx.simulator.active:
            self.ctx.costs = calibrate_solo(self, plan, self.ctx)
        self._on_base_device(stage)
        assert plan.hetpipe is not None
        log.info(
            "stages re-cut at %s (plan v%d): this rank runs layers %d to %d",
            plan.hetpipe.stage_boundaries,
            plan.version,
            stage.place.first_layer,
            stage.place.end_layer - 1,
        )

    def _pull(self, params: list[nn.Parameter], min_clock: int) -> int:
        assert self.client is not None
        weights, clock = self.client.pull([self.names[p] for p in params], min_clock)
        with torch.no_grad():
            for p in params:
                p.copy_(torch.from_numpy(weights[self.names[p]]).to(p.device, non_blocking=True))
        return clock

    def _wave(
        self, wave: list[Any], stage: PipelineStage, params: HetPipeParams
    ) -> tuple[float, float, float, int | None]:
        """Pull (past the WSP gate), run and push one wave: (loss, compute s, comm s, stop_after)."""
        ctx = self.ctx
        assert self.client is not None
        nm = params.microbatches_in_flight
        t0 = time.perf_counter()
        last_p = self.minibatches_done + len(wave)
        clock = self._pull(stage.params, required_global_clock(last_p, nm, params.staleness_bound))
        wave_numbers = range(self.minibatches_done + 1, last_p + 1)
        if self.verify:
            self.trace.extend(
                {"p": n, "completed": self.minibatches_done, "global_clock": clock} for n in wave_numbers
            )
        if not all(
            may_start(n, nm, params.staleness_bound, self.minibatches_done, clock) for n in wave_numbers
        ):
            raise RuntimeError("WSP gate violated: the parameter server returned too early")
        pulled = time.perf_counter()
        before = [p.detach().clone() for p in stage.params]
        for p in stage.params:
            p.grad = None
        loss, compute = stage.run_wave([ctx.batch(s.indices) for s in wave])
        ctx.optimizer.step()
        push_start = time.perf_counter()
        deltas = {self.names[p]: host_copy(p.detach() - b) for p, b in zip(stage.params, before, strict=True)}
        _, stop_after = self.client.push(
            stage.place.virtual_worker, stage.place.stage, self.waves_done, deltas, ctx.stop.requested()
        )
        end = time.perf_counter()
        self.waves_done += 1
        self.minibatches_done = last_p
        wave_samples = sum(len(s.indices) for s in wave) if stage.place.stage == 0 else 0
        comm = (pulled - t0) + (end - push_start)
        ctx.metrics.record_step(StepRecord(compute, pulled - t0, comm, end - t0, wave_samples))
        return loss, compute, comm, stop_after

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx, stage, params = self.ctx, self.stage, self.params
        assert stage is not None and params is not None
        vw_batches = [plan.local_batches[ranks[0]] for ranks in params.virtual_workers]
        sampler = UnevenBatchSampler(ctx.sampler.dataset_size, stage.place.virtual_worker, ctx.env.seed)
        steps = [s for s in sampler.epoch(position, vw_batches) if len(s.indices)]
        nm = params.microbatches_in_flight
        totals = StepTotals()
        started = time.perf_counter()
        stopped_at = None
        for first in range(0, len(steps), nm):
            wave = steps[first : first + nm]
            loss, compute, comm, stop_after = self._wave(wave, stage, params)
            samples = sum(len(s.indices) for s in wave) if stage.place.stage == 0 else 0
            totals.add(loss / len(wave), compute, comm, samples, steps=len(wave))
            if ctx.guard is not None:
                ctx.guard.record_loss(loss)  # the last stage's; the epoch's end shares it
            if stop_after is not None and self.waves_done >= stop_after and first + nm < len(steps):
                stopped_at = wave[-1].position_after
                break
        # Epoch boundary (or an agreed stop): every VW has pushed everything; every rank takes the
        # full global model.
        if ctx.world_size > 1:
            dist.barrier()
        self._pull([p for p in self.layers.parameters() if p.requires_grad], 0)
        if self.verify:
            trace_file = Path(str(ctx.env.result_file or "hetpipe") + f".trace-{ctx.rank}.json")
            trace_file.write_text(
                json.dumps({"nm": nm, "staleness": params.staleness_bound, "trace": self.trace})
            )
        extra = {"virtual_worker": float(stage.place.virtual_worker), "stage": float(stage.place.stage)}
        stats = totals.stats(time.perf_counter() - started, extra, stopped_at)
        if not stage.is_last:
            stats.loss = 0.0
        return stats

    def evaluation_model(self) -> nn.Module:
        return self.ctx.model

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=10)


def host_copy(tensor: torch.Tensor) -> np.ndarray:
    """A tensor's values for the parameter server, which keeps fp32 master weights in host memory."""
    return tensor.detach().to("cpu", torch.float32).numpy()
