"""Where each rank sits in a HetPipe job, and the layout a local run starts from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hetero_operator.plan import HetPipeParams
from hetero_operator.planner.batch import proportional_split
from hetero_operator.planner.pipeline import compute_only_cuts


@dataclass(frozen=True)
class StagePlace:
    virtual_worker: int
    stage: int
    stages: int
    first_layer: int
    end_layer: int  # exclusive; None-free: the caller passes the model's layer count
    previous_rank: int | None
    next_rank: int | None


def place_of(params: HetPipeParams, rank: int, layer_count: int) -> StagePlace:
    for vw, ranks in enumerate(params.virtual_workers):
        if rank in ranks:
            stage = ranks.index(rank)
            bounds = [0, *params.stage_boundaries[vw], layer_count]
            if bounds[-2] >= layer_count:
                raise ValueError(
                    f"hetpipe.stage_boundaries[{vw}] = {params.stage_boundaries[vw]} cuts beyond the model's "
                    f"{layer_count} layers"
                )
            return StagePlace(
                virtual_worker=vw,
                stage=stage,
                stages=len(ranks),
                first_layer=bounds[stage],
                end_layer=bounds[stage + 1],
                previous_rank=ranks[stage - 1] if stage > 0 else None,
                next_rank=ranks[stage + 1] if stage + 1 < len(ranks) else None,
            )
    raise ValueError(f"rank {rank} is in no hetpipe virtual worker")


def same_pipelines(a: HetPipeParams, b: HetPipeParams) -> bool:
    """The same ranks in the same pipelines, waves and staleness: only the stage cuts may differ."""
    return (a.virtual_workers, a.microbatches_in_flight, a.staleness_bound) == (
        b.virtual_workers,
        b.microbatches_in_flight,
        b.staleness_bound,
    )


def stage_boundaries(
    layer_costs: Sequence[float], stage_speeds: Sequence[float], in_flight: int
) -> list[int]:
    """Cuts of a pipeline over GPUs of the given speeds, in the given order, from the planner."""
    return compute_only_cuts(layer_costs, stage_speeds, in_flight)


def local_hetpipe_params(
    speeds: Sequence[float], layer_costs: Sequence[float], global_batch: int
) -> tuple[HetPipeParams, list[int]]:
    """A local layout: the fastest rank alone, the others one pipeline; batch split by VW speed.

    Returns the parameters and the per-rank local batches (a VW's minibatch sits on its first stage).
    """
    fastest = max(range(len(speeds)), key=lambda r: (speeds[r], -r))
    rest = [r for r in range(len(speeds)) if r != fastest]
    groups = [[fastest], rest] if rest else [[fastest]]
    in_flight = max(len(g) for g in groups)
    cuts = [stage_boundaries(layer_costs, [speeds[r] for r in g], in_flight) for g in groups]
    # A saturated pipeline runs at the sum of its stages' speeds (balanced cuts).
    vw_speed = [sum(speeds[r] for r in g) for g in groups]
    vw_batches = proportional_split(global_batch, vw_speed, [1] * len(groups), [float("inf")] * len(groups))
    local = [0] * len(speeds)
    for group, batch in zip(groups, vw_batches, strict=True):
        local[group[0]] = int(batch)
    params = HetPipeParams(
        virtual_workers=groups, stage_boundaries=cuts, microbatches_in_flight=in_flight, staleness_bound=0
    )
    return params, local
