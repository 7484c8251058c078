"""One rank of bench/byos_overhead.py: the same training step, alternately under plain
DistributedDataParallel with a DistributedSampler and under heterotrain's HeteroModel and
HeteroDataLoader on an even split, in rounds, so drift of a busy host touches both alike."""

from __future__ import annotations

import copy
import json
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import hetero_runtime.wrap as heterotrain

ROUNDS = int(os.environ["BENCH_ROUNDS"])
STEPS = int(os.environ["BENCH_STEPS"])
GLOBAL_BATCH = int(os.environ["BENCH_GLOBAL_BATCH"])
WIDTH = int(os.environ["BENCH_WIDTH"])

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
session = heterotrain.init()
world = session.world_size
torch.manual_seed(0)
SAMPLES = GLOBAL_BATCH * 100  # epochs of 100 steps: their boundaries (a plan read) are rare, as in training
data = TensorDataset(torch.randn(SAMPLES, WIDTH), torch.randint(0, 10, (SAMPLES,)))
net = nn.Sequential(
    nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 10)
)

plain = DistributedDataParallel(copy.deepcopy(net))
plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.01, momentum=0.9)
sampler: DistributedSampler[Any] = DistributedSampler(data, seed=0)
plain_loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)

wrapped = heterotrain.HeteroModel(copy.deepcopy(net))
wrapped_optimizer = torch.optim.SGD(wrapped.parameters(), lr=0.01, momentum=0.9)
wrapped_loader = heterotrain.HeteroDataLoader(data, batch_size=GLOBAL_BATCH)


def endless(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def timed_steps(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[Any]) -> list[float]:
    """STEPS steps as the user's loop runs them: fetch, forward, backward (and sync), step."""
    times = []
    for _ in range(STEPS):
        started = time.perf_counter()
        x, y = next(batches)
        optimizer.zero_grad()
        functional.cross_entropy(model(x), y).backward()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return times


batches = {"plain": endless(plain_loader), "wrapped": endless(wrapped_loader)}
plain_times: list[float] = []
wrapped_times: list[float] = []
round_ratios: list[float] = []  # wrapped ÷ plain median step of each round: paired in time
for round_index in range(ROUNDS + 1):  # round 0 warms both up and is not counted
    order = [("plain", plain, plain_optimizer), ("wrapped", wrapped, wrapped_optimizer)]
    if round_index % 2:
        order.reverse()
    medians = {}
    for name, model, optimizer in order:
        times = timed_steps(model, optimizer, batches[name])
        medians[name] = statistics.median(times)
        if round_index > 0:
            (plain_times if name == "plain" else wrapped_times).extend(times)
    if round_index > 0:
        round_ratios.append(medians["wrapped"] / medians["plain"])

if session.rank == 0:
    Path(os.environ["BENCH_OUT"]).write_text(
        json.dumps(
            {
                "plain_median_s": statistics.median(plain_times),
                "wrapped_median_s": statistics.median(wrapped_times),
                "plain_mean_s": statistics.fmean(plain_times),
                "wrapped_mean_s": statistics.fmean(wrapped_times),
                "round_ratio_median": statistics.median(round_ratios),
                "round_ratios": round_ratios,
                "steps_each": len(plain_times),
                "parameters": sum(p.numel() for p in net.parameters()),
            }
        )
    )
heterotrain.close()
