"""HetPipe's stage cuts from the layer costs the workers measured (pure).

Every rank times each layer of the model on its own device (`heterotrain_worker_layer_seconds_per_
sample`). For each virtual worker the planner cuts the reference costs (those of its fastest rank)
over stage speeds taken from the same measurements (the fastest rank's total over each rank's), and
the cuts are judged on the measured costs of the rank that would run each slice: a pipeline runs at
the pace of its slowest stage. The new cuts are taken only where they shorten that stage by at least
the spec's `rebalance.minImprovement`: near-equal cuts never alternate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hetero_operator.plan import HetPipeParams, Plan
from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.pipeline import compute_only_cuts

LayerCosts = Mapping[int, Sequence[float]]  # per rank: per-sample seconds of each layer


@dataclass(frozen=True)
class PipelineCuts:
    """One virtual worker's cuts now and proposed, with their slowest stage (seconds per sample)."""

    virtual_worker: int
    current: list[int]
    proposed: list[int]
    current_bottleneck: float
    proposed_bottleneck: float

    @property
    def gain(self) -> float:
        return 1 - self.proposed_bottleneck / self.current_bottleneck if self.current_bottleneck > 0 else 0.0


@dataclass(frozen=True)
class Recut:
    plan: Plan | None  # the next plan, or None when every pipeline keeps its cuts
    pipelines: tuple[PipelineCuts, ...]
    reason: str


class LayerCostsMissing(ValueError):
    """Some rank has not reported its layer costs (yet), or they do not fit the plan."""


def bottleneck(costs: LayerCosts, ranks: Sequence[int], cuts: Sequence[int]) -> float:
    """The slowest stage of one pipeline cut at `cuts`: each stage's layers at its own rank's costs."""
    bounds = [0, *cuts, len(costs[ranks[0]])]
    return max(sum(costs[rank][bounds[s] : bounds[s + 1]]) for s, rank in enumerate(ranks))


def proposed_cuts(costs: LayerCosts, ranks: Sequence[int], in_flight: int) -> list[int]:
    """The planner's minimum-bottleneck cuts of the fastest rank's costs over the measured speeds."""
    totals = {rank: sum(costs[rank]) for rank in ranks}
    reference = min(ranks, key=lambda rank: (totals[rank], rank))
    speeds = [totals[reference] / totals[rank] for rank in ranks]
    return compute_only_cuts(list(costs[reference]), speeds, in_flight)


def check_costs(costs: LayerCosts, params: HetPipeParams) -> None:
    ranks = [rank for pipeline in params.virtual_workers for rank in pipeline]
    missing = sorted(rank for rank in ranks if not costs.get(rank))
    if missing:
        raise LayerCostsMissing(f"no layer costs from rank(s) {missing}")
    counts = {len(costs[rank]) for rank in ranks}
    if len(counts) != 1:
        raise LayerCostsMissing(f"ranks report different layer counts {sorted(counts)}")
    if any(not all(c > 0 for c in costs[rank]) for rank in ranks):
        raise LayerCostsMissing("a layer cost is not a positive number of seconds")


def recut(plan: Plan, costs: LayerCosts, min_improvement: float, apply_at_epoch: int) -> Recut:
    """Plan `version + 1` with each pipeline cut where the measured costs balance its stages best,
    if that shortens some pipeline's slowest stage by `min_improvement` or more."""
    params = plan.hetpipe
    if params is None:
        raise ValueError(f"plan v{plan.version} is not a hetpipe plan")
    check_costs(costs, params)
    pipelines = []
    for index, ranks in enumerate(params.virtual_workers):
        current = list(params.stage_boundaries[index])
        try:
            proposed = proposed_cuts(costs, ranks, params.microbatches_in_flight)
        except PlanningError as err:
            raise LayerCostsMissing(f"virtual worker {index}: {err}") from err
        now, then = bottleneck(costs, ranks, current), bottleneck(costs, ranks, proposed)
        pipelines.append(PipelineCuts(index, current, proposed, now, then))
    taken = [p.proposed if p.gain >= min_improvement else p.current for p in pipelines]
    summary = "; ".join(
        f"pipeline {p.virtual_worker}: cuts {p.current} -> {p.proposed}, slowest stage "
        f"{p.current_bottleneck * 1e6:.1f} -> {p.proposed_bottleneck * 1e6:.1f} us/sample ({p.gain:+.0%})"
        for p in pipelines
    )
    if taken == [p.current for p in pipelines]:
        return Recut(None, tuple(pipelines), f"stage cuts stay (gain below {min_improvement:.0%}): {summary}")
    new_params = params.model_copy(update={"stage_boundaries": taken})
    new = plan.model_copy(
        update={
            "version": plan.version + 1,
            "apply_at_epoch": apply_at_epoch,
            "hetpipe": new_params,
            "predicted_iteration_seconds": None,  # the costs say which cut is faster, not a step's time
        }
    )
    return Recut(new, tuple(pipelines), f"stages re-cut from the workers' measured layer costs: {summary}")
