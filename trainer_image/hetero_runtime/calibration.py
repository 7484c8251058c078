"""The simulated base device, calibrated once at start: each rank times its compute while the others
wait (solo, so no rank's figure includes another's load), then ranks that run the same work all take
the slowest figure, so every simulated GPU is a fraction of one and the same base device."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from hetero_operator.plan import Plan
from hetero_runtime.strategies.base import TrainingStrategy, WorkerContext

log = logging.getLogger(__name__)


def common_costs(costs: dict[str, float], device: torch.device) -> dict[str, float]:
    """Every rank's costs replaced by the highest over the ranks (all ranks hold the same keys)."""
    keys = sorted(costs)
    values = torch.tensor([costs[key] for key in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return dict(zip(keys, values.tolist(), strict=True))


def calibrate_solo(strategy: TrainingStrategy, plan: Plan, ctx: WorkerContext) -> dict[str, float]:
    """Per-sample seconds of each compute segment of `strategy` on the base device."""
    world = ctx.world_size
    costs: dict[str, float] = {}
    for turn in range(world):
        if world > 1:
            dist.barrier()
        if ctx.rank == turn:
            costs = strategy.calibrate(plan)
    if world > 1:
        dist.barrier()
        if strategy.symmetric:
            costs = common_costs(costs, ctx.device)
    log.info(
        "simulated base device: %s per sample (calibrated solo)",
        ", ".join(f"{key} {value * 1e6:.1f} us" for key, value in sorted(costs.items())),
    )
    return costs
