"""One rank of bench/byos_overhead.py: the same training step, alternately under plain
DistributedDataParallel with a DistributedSampler and under heterotrain's HeteroModel and
HeteroDataLoader on an even split, one step of each in turn."""

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


def timed_step(model: nn.Module, optimizer: torch.optim.Optimizer, batches: Iterator[Any]) -> float:
    """One step as the user's loop runs it: fetch, forward, backward (and sync), optimizer step."""
    started = time.perf_counter()
    x, y = next(batches)
    optimizer.zero_grad()
    functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    return time.perf_counter() - started


batches = {"plain": endless(plain_loader), "wrapped": endless(wrapped_loader)}
variants = {"plain": (plain, plain_optimizer), "wrapped": (wrapped, wrapped_optimizer)}
times: dict[str, list[float]] = {"plain": [], "wrapped": []}
round_ratios: list[float] = []  # wrapped ÷ plain median step of each round
for round_index in range(ROUNDS + 1):  # round 0 warms both up and is not counted
    in_round: dict[str, list[float]] = {"plain": [], "wrapped": []}
    for step in range(STEPS):
        # Step by step, in alternating order: a busy host's drift touches both alike.
        for name in ("plain", "wrapped") if step % 2 == 0 else ("wrapped", "plain"):
            model, optimizer = variants[name]
            in_round[name].append(timed_step(model, optimizer, batches[name]))
    if round_index > 0:
        for name, measured in in_round.items():
            times[name].extend(measured)
        round_ratios.append(statistics.median(in_round["wrapped"]) / statistics.median(in_round["plain"]))
plain_times, wrapped_times = times["plain"], times["wrapped"]

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
                "wrapped_buckets": len(wrapped.reduce.buckets),
            }
        )
    )
heterotrain.close()
