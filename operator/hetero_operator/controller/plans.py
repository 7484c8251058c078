"""The plan a job starts each allocation with, from the GPUClass speed priors (pure).

Later versions come from the rebalancer, which measures the workers; this module only writes the
first plan of an allocation: local batches in proportion to each GPU's `relativeSpeed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hetero_operator import plan as contract
from hetero_operator.planner.batch import proportional_split
from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.pipeline import compute_only_cuts
from hetero_operator.planner.wsp import learning_rate_scale
from hetero_operator.resources import Allocation, HeteroTrainJobSpec
from hetero_operator.resources import Plan as StatusPlan
from hetero_operator.resources.job_spec import InitialSplit
from hetero_operator.resources.parallelism import (
    DreamDDPParameters,
    ESyncParameters,
    HetPipeParameters,
    SESGDParameters,
)


class PlanBuildError(ValueError):
    """The allocation cannot run the job's strategy (for example SESGD groups that do not divide it)."""


def initial_plan(
    spec: HeteroTrainJobSpec,
    allocation: Allocation,
    speeds: Mapping[str, float],
    version: int = 1,
    predicted_iteration_seconds: float | None = None,
) -> contract.Plan:
    """Plan `version` for `allocation`: data-parallel strategies split the global batch by speed prior
    (or evenly with `rebalance.initialSplit: even`; capped by `batch.perGpuClassMax`); ESync gives
    every worker the same batch (speed shows in its local step count); HetPipe gives each virtual
    worker's first stage a share by summed stage speed, cuts its pipeline with the planner and scales
    the learning rate by one over the virtual workers."""
    workers = allocation.workers
    if not workers:
        raise PlanBuildError("allocation.workers: a plan needs at least one worker")
    strategy = contract.Strategy(spec.parallelism.strategy.value)
    world = len(workers)
    extra: dict[str, Any] = {}
    if strategy is contract.Strategy.HETPIPE:
        params = spec.parallelism.parameters()
        assert isinstance(params, HetPipeParameters)
        extra["hetpipe"], batches = _hetpipe(allocation, speeds, spec.batch.global_batch, params)
        extra["learning_rate_scale"] = learning_rate_scale(len(extra["hetpipe"].virtual_workers))
    elif strategy is contract.Strategy.ESYNC:
        params_e = spec.parallelism.parameters()
        assert isinstance(params_e, ESyncParameters)
        batches = contract.even_local_batches(spec.batch.global_batch, world)
        extra["esync"] = contract.ESyncParams(
            global_learning_rate=params_e.global_step_size,
            max_local_steps=params_e.max_local_steps,
            round_timeout_seconds=params_e.round_timeout_seconds,
        )
    else:
        even = spec.rebalance.initial_split is InitialSplit.EVEN
        weights = [1.0 if even else _speed(speeds, w.gpu_class) for w in workers]
        caps = [float(spec.batch.per_gpu_class_max.get(w.gpu_class, float("inf"))) for w in workers]
        batches = [int(b) for b in proportional_split(spec.batch.global_batch, weights, [1] * world, caps)]
        if strategy is contract.Strategy.SESGD:
            params_s = spec.parallelism.parameters()
            assert isinstance(params_s, SESGDParameters)
            extra["sesgd"] = contract.SESGDParams(groups=_sesgd_groups(params_s, world), seed=params_s.seed)
        elif strategy is contract.Strategy.DREAMDDP:
            params_d = spec.parallelism.parameters()
            assert isinstance(params_d, DreamDDPParameters)
            extra["dreamddp"] = contract.DreamDDPParams(period=params_d.period)
    return contract.Plan(
        version=version,
        strategy=strategy,
        world_size=world,
        global_batch=sum(batches),
        local_batches=batches,
        predicted_iteration_seconds=predicted_iteration_seconds or None,
        **extra,
    )


def _speed(speeds: Mapping[str, float], gpu_class: str) -> float:
    speed = speeds.get(gpu_class)
    if speed is None or speed <= 0:
        raise PlanBuildError(f"GPUClass {gpu_class!r}: no positive relativeSpeed known for it")
    return speed


def _sesgd_groups(params: SESGDParameters, world: int) -> int:
    if params.groups is None:
        return max(k for k in range(1, world + 1) if world % k == 0 and k * k <= world)
    if world % params.groups:
        raise PlanBuildError(
            f"parallelism.sesgd.groups={params.groups} does not divide the {world} workers placed"
        )
    return params.groups


def _hetpipe(
    allocation: Allocation, speeds: Mapping[str, float], global_batch: int, params: HetPipeParameters
) -> tuple[contract.HetPipeParams, list[int]]:
    groups: dict[int, list[tuple[int, int]]] = {}
    for worker in allocation.workers:
        group = worker.virtual_worker if worker.virtual_worker is not None else worker.rank
        groups.setdefault(group, []).append((worker.stage or 0, worker.rank))
    virtual_workers = [[rank for _, rank in sorted(members)] for _, members in sorted(groups.items())]
    by_rank = {w.rank: w for w in allocation.workers}
    stage_speeds = [[_speed(speeds, by_rank[r].gpu_class) for r in vw] for vw in virtual_workers]
    vw_speed = [sum(stages) for stages in stage_speeds]
    ones = [1] * len(virtual_workers)
    shares = proportional_split(global_batch, vw_speed, ones, [float("inf")] * len(virtual_workers))
    batches = [0] * len(allocation.workers)
    for vw, share in zip(virtual_workers, shares, strict=True):
        batches[vw[0]] = int(share)
    depth = params.pipeline_depth or max(len(vw) for vw in virtual_workers)
    cuts = [_stage_cuts(params.layer_costs, vw_speeds, depth) for vw_speeds in stage_speeds]
    return (
        contract.HetPipeParams(
            virtual_workers=virtual_workers,
            stage_boundaries=cuts,
            microbatches_in_flight=depth,
            staleness_bound=params.staleness,
        ),
        batches,
    )


def _stage_cuts(layer_costs: list[float] | None, stage_speeds: list[float], depth: int) -> list[int]:
    """The planner's minimum-bottleneck cuts of the spec's per-layer costs over the stages' speed
    priors. Without costs the operator does not know the model's layers: the smallest valid cuts
    (one layer per stage but the last) stand."""
    if layer_costs is None:
        return list(range(1, len(stage_speeds)))
    try:
        return compute_only_cuts(layer_costs, stage_speeds, depth)
    except PlanningError as exc:
        raise PlanBuildError(f"parallelism.hetpipe.layerCosts: {exc}") from exc


def plan_status(plan: contract.Plan, epoch: int = 0) -> StatusPlan:
    """The `status.plan` summary of a published plan."""
    return StatusPlan(
        version=plan.version,
        epoch=max(epoch, plan.apply_at_epoch),
        global_batch=plan.global_batch,
        local_batches=list(plan.local_batches),
        predicted_iteration_seconds=plan.predicted_iteration_seconds or 0.0,
    )
