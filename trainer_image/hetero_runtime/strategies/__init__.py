"""Training strategies, chosen by the plan's `strategy` field."""

from __future__ import annotations

from typing import Any

from hetero_operator.plan import Strategy
from hetero_runtime.strategies.base import TrainingStrategy, WorkerContext


def build_strategy(kind: Strategy, ctx: WorkerContext, options: dict[str, Any]) -> TrainingStrategy:
    """Construct the runner for `kind`; strategy modules are imported only when chosen."""
    if kind == Strategy.DATA:
        from hetero_runtime.strategies.data import DataStrategy

        return DataStrategy(ctx)
    if kind == Strategy.SESGD:
        from hetero_runtime.strategies.sesgd import SESGDStrategy

        return SESGDStrategy(ctx)
    if kind == Strategy.ESYNC:
        from hetero_runtime.strategies.esync import ESyncStrategy

        return ESyncStrategy(ctx)
    if kind == Strategy.DREAMDDP:
        from hetero_runtime.strategies.dreamddp import DreamDDPStrategy

        return DreamDDPStrategy(ctx)
    if kind == Strategy.HETPIPE:
        from hetero_runtime.strategies.hetpipe import HetPipeStrategy

        return HetPipeStrategy(ctx, options)
    raise ValueError(f"unknown strategy {kind!r}")
