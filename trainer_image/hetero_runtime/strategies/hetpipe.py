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

import json
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
from hetero_runtime.hetpipe_ps import ParameterServerClient, start_server_process
from hetero_runtime.metrics import StepRecord
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.simulate import SpeedSimulator
from hetero_runtime.strategies.base import (
    EpochStats,
    LossFn,
    WorkerContext,
    apply_learning_rate_scale,
    broadcast_model,
    fetch_batch,
)
from hetero_runtime.strategies.hetpipe_layout import StagePlace, place_of

VERIFY_ENV = "HETEROTRAIN_VERIFY_INVARIANTS"
_MAX_DIMS = 8


def send_activation(tensor: torch.Tensor, to_rank: int, keep: list[Any]) -> None:
    """Non-blocking send of a shape header and the data (kept alive in `keep` until waited)."""
    header = torch.zeros(_MAX_DIMS + 1, dtype=torch.long)
    header[0] = tensor.dim()
    header[1 : 1 + tensor.dim()] = torch.tensor(tensor.shape)
    payload = tensor.detach().contiguous()
    keep.extend([dist.isend(header, to_rank), dist.isend(payload, to_rank), header, payload])


def receive_activation(from_rank: int) -> torch.Tensor:
    header = torch.empty(_MAX_DIMS + 1, dtype=torch.long)
    dist.recv(header, from_rank)
    shape = [int(x) for x in header[1 : 1 + int(header[0])]]
    payload = torch.empty(shape)
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
        self, layers: nn.Sequential, place: StagePlace, loss_fn: LossFn, simulator: SpeedSimulator
    ) -> None:
        self.loss_fn = loss_fn
        self.simulator = simulator
        self.place = place
        self.module = nn.Sequential(*list(layers)[place.first_layer : place.end_layer])
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    @property
    def is_last(self) -> bool:
        return self.place.next_rank is None

    def run_wave(self, batches: list[Any]) -> tuple[float, float]:
        """Forward and backward of every minibatch of a wave; gradients accumulate over the wave.

        `batches` holds each minibatch's (inputs, targets) where this stage needs them (the first
        stage reads inputs, the last reads targets). Returns (summed loss, compute seconds).
        """
        keep: list[Any] = []
        pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        loss_total = compute = 0.0
        for inputs, targets in batches:
            if self.place.previous_rank is None:
                x = inputs
            else:
                x = receive_activation(self.place.previous_rank).requires_grad_()
            watch = self.simulator.begin()
            out = self.module(x)
            if self.is_last:
                loss = self.loss_fn(out, targets)
                loss.backward()
                loss_total += float(loss.detach())
            compute += self.simulator.finish(watch)
            if self.is_last:
                if self.place.previous_rank is not None:
                    assert x.grad is not None
                    keep.extend([dist.isend(x.grad.contiguous(), self.place.previous_rank), x.grad])
            else:
                assert self.place.next_rank is not None
                send_activation(out, self.place.next_rank, keep)
                pending.append((x, out))
        for x, out in pending:  # backward in minibatch order (FIFO)
            assert self.place.next_rank is not None
            grad = torch.empty_like(out)
            dist.recv(grad, self.place.next_rank)
            watch = self.simulator.begin()
            out.backward(grad)
            compute += self.simulator.finish(watch)
            if self.place.previous_rank is not None:
                assert x.grad is not None
                keep.extend([dist.isend(x.grad.contiguous(), self.place.previous_rank), x.grad])
        wait_all(keep)
        return loss_total, compute


class HetPipeStrategy:
    name = "hetpipe"

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

    def start(self, plan: Plan) -> None:
        ctx = self.ctx
        assert plan.hetpipe is not None
        self.params = plan.hetpipe
        place = place_of(plan.hetpipe, ctx.rank, len(self.layers))
        self.stage = PipelineStage(self.layers, place, ctx.loss_fn, ctx.simulator)
        apply_learning_rate_scale(ctx, plan.learning_rate_scale)
        if ctx.world_size > 1:
            broadcast_model(self.layers)
        port = ctx.env.master_port + 2
        if ctx.rank == 0:
            self.server = start_server_process(port, [len(vw) for vw in plan.hetpipe.virtual_workers])
        self.client = ParameterServerClient(ctx.env.master_addr, port)
        if ctx.rank == 0:
            self.client.initialize({name: p.detach().numpy().copy() for p, name in self.names.items()})
        if ctx.world_size > 1:
            dist.barrier()

    def apply_plan(self, plan: Plan) -> None:
        if plan.hetpipe != self.params:
            raise ValueError(
                "a new hetpipe layout needs a restart from checkpoint (stages are fixed at start)"
            )
        apply_learning_rate_scale(self.ctx, plan.learning_rate_scale)

    def _pull(self, params: list[nn.Parameter], min_clock: int) -> int:
        assert self.client is not None
        weights, clock = self.client.pull([self.names[p] for p in params], min_clock)
        with torch.no_grad():
            for p in params:
                p.copy_(torch.from_numpy(weights[self.names[p]]))
        return clock

    def run_epoch(self, position: SamplerPosition, plan: Plan) -> EpochStats:
        ctx, stage, params = self.ctx, self.stage, self.params
        assert stage is not None and params is not None and self.client is not None
        vw_batches = [plan.local_batches[ranks[0]] for ranks in params.virtual_workers]
        sampler = UnevenBatchSampler(ctx.sampler.dataset_size, stage.place.virtual_worker, ctx.env.seed)
        steps = [s for s in sampler.epoch(position, vw_batches) if len(s.indices)]
        nm = params.microbatches_in_flight
        loss_sum = compute_sum = comm_sum = 0.0
        samples = 0
        started = time.perf_counter()
        for first in range(0, len(steps), nm):
            wave = steps[first : first + nm]
            t0 = time.perf_counter()
            last_p = self.minibatches_done + len(wave)
            clock = self._pull(stage.params, required_global_clock(last_p, nm, params.staleness_bound))
            wave_numbers = range(self.minibatches_done + 1, last_p + 1)
            if self.verify:
                for number in wave_numbers:
                    self.trace.append(
                        {"p": number, "completed": self.minibatches_done, "global_clock": clock}
                    )
            if not all(
                may_start(n, nm, params.staleness_bound, self.minibatches_done, clock) for n in wave_numbers
            ):
                raise RuntimeError("WSP gate violated: the parameter server returned too early")
            pulled = time.perf_counter()
            before = [p.detach().clone() for p in stage.params]
            for p in stage.params:
                p.grad = None
            batches = [fetch_batch(ctx.dataset, s.indices) for s in wave]
            loss, compute = stage.run_wave(batches)
            ctx.optimizer.step()
            push_start = time.perf_counter()
            deltas = {
                self.names[p]: (p.detach() - b).numpy() for p, b in zip(stage.params, before, strict=True)
            }
            self.client.push(stage.place.virtual_worker, stage.place.stage, self.waves_done, deltas)
            end = time.perf_counter()
            self.waves_done += 1
            self.minibatches_done = last_p
            wave_samples = sum(len(s.indices) for s in wave) if stage.place.stage == 0 else 0
            comm = (pulled - t0) + (end - push_start)
            ctx.metrics.record_step(StepRecord(compute, pulled - t0, comm, end - t0, wave_samples))
            loss_sum += loss
            compute_sum += compute
            comm_sum += comm
            samples += wave_samples
        # Epoch boundary: every VW has pushed everything; every rank takes the full global model.
        if ctx.world_size > 1:
            dist.barrier()
        self._pull([p for p in self.layers.parameters() if p.requires_grad], 0)
        if self.verify:
            trace_file = Path(str(ctx.env.result_file or "hetpipe") + f".trace-{ctx.rank}.json")
            trace_file.write_text(
                json.dumps({"nm": nm, "staleness": params.staleness_bound, "trace": self.trace})
            )
        losses = float(np.sum(loss_sum))
        return EpochStats(
            loss=losses / max(len(steps), 1) if stage.is_last else 0.0,
            samples=samples,
            steps=len(steps),
            compute_seconds=compute_sum,
            comm_seconds=comm_sum,
            wall_seconds=time.perf_counter() - started,
            extra={"virtual_worker": float(stage.place.virtual_worker), "stage": float(stage.place.stage)},
        )

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
