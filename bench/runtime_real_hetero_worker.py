"""One worker of bench/runtime_real_hetero.py: its own device (a GPU, or CPU threads on its own cores),
no simulated speed; every tensor on that device, batches copied from pinned memory to a GPU."""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn import functional

from bench_workers import gather, join_gloo, seeded_model, step_means, worker_entry
from hetero_runtime.device import to_device
from hetero_runtime.prefetch import staged
from hetero_runtime.strategies.data import gradient_reducer, synchronize_gradients
from runtime_balance_worker import conv_net, phase_report, rounds
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
        self.reducer = gradient_reducer(self.params, self.rank, self.world)
        self.global_batch = config["global_batch"]
        self.data = torch.randn(self.global_batch, 8, config["length"])
        self.labels = torch.randint(0, 10, (self.global_batch,))
        self.pin = self.device.type == "cuda"
        if self.pin:
            # An in-memory dataset a GPU trains on is pinned once (a DataLoader's pin thread does it off
            # the step): each step then only copies, one step ahead, beside the compute.
            self.data, self.labels = self.data.pin_memory(), self.labels.pin_memory()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def batches(self, b: int, steps: int) -> Iterator[Any]:
        """`steps` batches of `b` samples on this device, each copied while the step before computes."""
        return staged(
            itertools.repeat(b, steps),
            lambda n: to_device((self.data[:n], self.labels[:n]), self.device, self.pin) if n else None,
            self.device,
        )

    def compute(self, batches: Iterator[Any]) -> tuple[float, float]:
        """Forward and backward of the next batch on this device: (loss, seconds, its fetch included)."""
        started = time.perf_counter()
        batch = next(batches)
        for p in self.params:
            p.grad = None
        loss = 0.0
        if batch is not None:
            inputs, labels = batch
            out = functional.cross_entropy(self.model(inputs), labels)
            out.backward()
            loss = float(out.detach())
        self.sync()
        return loss, time.perf_counter() - started

    def warm_up(self, b: int, seconds: float = 1.0) -> None:
        """Steps for a second before timing: a GPU idle between phases runs at a low clock until it has
        been busy a while, and its first steps at a new shape pay for kernel selection."""
        batches = self.batches(b, 1 << 30)
        deadline = time.perf_counter() + seconds
        self.compute(batches)
        while time.perf_counter() < deadline:
            self.compute(batches)

    def in_turns(self, b: int, steps: int) -> dict[str, float]:
        """Each worker alone, one after the other: its compute speed at `b` samples."""
        mine: dict[str, float] = {}
        for turn in range(self.world):
            dist.barrier()
            if self.rank == turn:
                self.warm_up(b)
                batches = self.batches(b, steps)
                times = [self.compute(batches)[1] for _ in range(steps)]
                mine = {"local_batch": b, "compute_s": float(np.median(times))}
        dist.barrier()
        return mine

    def phase(self, split: list[int], steps: int) -> dict[str, Any]:
        computes, syncs, comms, step_times = [], [], [], []
        b = split[self.rank]
        batches = self.batches(b, steps)
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            loss, compute = self.compute(batches)
            sync = time.perf_counter()
            synchronize_gradients(
                self.params, b, self.global_batch, loss, self.rank, self.world, reducer=self.reducer
            )
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

    def sync_alone(self, split: list[int], repeats: int) -> float:
        """The gradient all-reduce with no compute before it (all ranks ready at once): the median
        milliseconds of the part of a step no split can remove."""
        times = []
        for _ in range(repeats):
            dist.barrier()
            started = time.perf_counter()
            synchronize_gradients(
                self.params,
                split[self.rank],
                self.global_batch,
                0.0,
                self.rank,
                self.world,
                reducer=self.reducer,
            )
            self.sync()
            times.append(time.perf_counter() - started)
        return float(np.median(times)) * 1e3

    def gather(self, value: Any) -> list[Any]:
        return gather(value, self.world)


def worker_main(config: dict[str, Any]) -> None:
    worker = RealWorker(config)
    world, total, rank = worker.world, worker.global_batch, worker.rank
    even = [total // world + (1 if r < total % world else 0) for r in range(world)]
    # A first guess from each worker alone on a few samples, then rounds decided by the operator's own
    # rebalancer from what each worker does with all of them running, as between epochs: a GPU beside
    # busy CPU workers, and a CPU worker on a small share (in cache), differ from their solo guesses.
    probe = min(even[rank], config["probe_batch"])
    first_solo = worker.gather(worker.in_turns(probe, config["solo_steps"]))
    first = proportional(total, [s["local_batch"] / s["compute_s"] for s in first_solo])

    def run(name: str, split: list[int], steps: int) -> list[dict[str, Any]]:
        worker.warm_up(split[rank])
        return worker.gather(worker.phase(split, steps))

    first_means = run("first", first, config["round_steps"])
    plan, rounds_run, settled = rounds(rank, config, run, (first, config["round_steps"], first_means))
    split = list(plan.local_batches)
    balanced = split
    solo = worker.gather(worker.in_turns(balanced[rank], config["solo_steps"]))
    worker.warm_up(balanced[rank])
    worker.phase(balanced, 2)  # warm-up of the collective
    phases = {}
    for name, split, steps in (
        ("even", even, config["even_steps"]),
        ("balanced", balanced, config["steps"]),
        ("even_again", even, config["even_steps"]),
    ):
        phases[name] = phase_report(split, steps, total, worker.gather(worker.phase(split, steps)))
    sync_alone = worker.gather(worker.sync_alone(balanced, config["steps"]))
    if rank == 0:
        record = {
            "first_solo": first_solo,
            "first": phase_report(first, config["round_steps"], total, first_means),
            "rounds": rounds_run,
            "settled": settled,
            "solo": solo,
            **phases,
            "sync_alone_ms": sync_alone,
        }
        Path(config["out"]).write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker_entry(worker_main)
