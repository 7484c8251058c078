"""One worker of bench/runtime_real_hetero.py: its own device (a GPU, or CPU threads on its own cores),
no simulated speed; every tensor on that device, batches copied from pinned memory to a GPU."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional

from bench_workers import gather, join_gloo, seeded_model, step_means, worker_entry
from hetero_runtime.device import to_device
from hetero_runtime.strategies.data import synchronize_gradients
from runtime_balance_worker import conv_net, phase_report
from runtime_real_hetero import proportional


class RealWorker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        plan = config["workers"][self.rank]
        os.sched_setaffinity(0, set(plan["cores"]))
        torch.set_num_threads(plan["threads"])
        self.device = torch.device(plan["device"])
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        # gloo for every rank: NCCL cannot reach the CPU workers; gloo stages a GPU's buffers itself.
        join_gloo(self.rank, self.world, 600)
        self.model = seeded_model(lambda: conv_net(config["channels"]), self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.params = list(self.model.parameters())
        self.global_batch = config["global_batch"]
        self.data = torch.randn(self.global_batch, 8, config["length"])
        self.labels = torch.randint(0, 10, (self.global_batch,))

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def compute(self, b: int) -> tuple[float, float]:
        """Forward and backward of `b` samples on this device: (loss, seconds)."""
        started = time.perf_counter()
        for p in self.params:
            p.grad = None
        loss = 0.0
        if b > 0:
            inputs, labels = to_device(
                (self.data[:b], self.labels[:b]), self.device, self.device.type == "cuda"
            )
            out = functional.cross_entropy(self.model(inputs), labels)
            out.backward()
            loss = float(out.detach())
        self.sync()
        return loss, time.perf_counter() - started

    def warm_up(self, b: int, seconds: float = 1.0) -> None:
        """Steps for a second before timing: a GPU idle between phases runs at a low clock until it has
        been busy a while, and its first steps at a new shape pay for kernel selection."""
        deadline = time.perf_counter() + seconds
        self.compute(b)
        while time.perf_counter() < deadline:
            self.compute(b)

    def in_turns(self, b: int, steps: int) -> dict[str, float]:
        """Each worker alone, one after the other: its compute speed at `b` samples."""
        mine: dict[str, float] = {}
        for turn in range(self.world):
            dist.barrier()
            if self.rank == turn:
                self.warm_up(b)
                times = [self.compute(b)[1] for _ in range(steps)]
                mine = {"local_batch": b, "compute_s": float(np.median(times))}
        dist.barrier()
        return mine

    def phase(self, split: list[int], steps: int) -> dict[str, Any]:
        computes, syncs, comms, step_times = [], [], [], []
        b = split[self.rank]
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            loss, compute = self.compute(b)
            sync = time.perf_counter()
            synchronize_gradients(self.params, b, self.global_batch, loss, self.rank, self.world)
            self.sync()
            comm = time.perf_counter() - sync
            self.optimizer.step()
            computes.append(compute)
            syncs.append(sync - step_start)
            comms.append(comm)
            step_times.append(time.perf_counter() - step_start)
        wall = time.perf_counter() - started
        return {
            **step_means(computes, syncs, comms, step_times, wall),
            "cpu_per_sample": 0.0,
            "overrun_share": 0.0,
        }

    def gather(self, value: Any) -> list[Any]:
        return gather(value, self.world)


def worker_main(config: dict[str, Any]) -> None:
    worker = RealWorker(config)
    world, total, steps, solo_steps = worker.world, worker.global_batch, config["steps"], config["solo_steps"]
    even = [total // world + (1 if r < total % world else 0) for r in range(world)]
    first_solo = worker.gather(worker.in_turns(even[worker.rank], solo_steps))
    speeds = [s["local_batch"] / s["compute_s"] for s in first_solo]
    balanced = proportional(total, speeds)
    solo = worker.gather(worker.in_turns(balanced[worker.rank], solo_steps))
    worker.warm_up(even[worker.rank])
    worker.phase(even, 2)  # warm-up of the collective
    phases = {}
    for name, split in (("even", even), ("balanced", balanced), ("even_again", even)):
        phases[name] = phase_report(split, steps, total, worker.gather(worker.phase(split, steps)))
    if worker.rank == 0:
        Path(config["out"]).write_text(json.dumps({"first_solo": first_solo, "solo": solo, **phases}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker_entry(worker_main)
