"""Pure planning mathematics for heterogeneous training (no kopf, kubernetes or torch).

Stable entry points for the scheduler, the rebalancer and the worker runtime:

- batch split: ``WorkerModel``, ``ClusterModel``, ``optimal_split``, ``continuous_split``,
  ``predict_iteration_time``; warm-up and fitting: ``PerfSample``, ``WorkerSpec``, ``next_split``;
  total batch: ``choose_global_batch``, ``lr_factor``
- pipelines: ``partition_pipeline``, ``choose_nm``; virtual workers: ``allocate_virtual_workers``;
  WSP gate: ``may_start``
- ``dreamddp_schedule``, ``esync_local_steps``, ``sesgd_group_schedule``
"""

from hetero_operator.planner.batch import (
    ClusterModel,
    ContinuousSplit,
    Split,
    WorkerModel,
    continuous_split,
    even_split,
    optimal_split,
    predict_iteration_time,
    worker_ready_times,
)
from hetero_operator.planner.dreamddp import DreamSchedule
from hetero_operator.planner.dreamddp import schedule as dreamddp_schedule
from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.esync import local_steps as esync_local_steps
from hetero_operator.planner.fitting import (
    PerfSample,
    SplitDecision,
    WarmupStage,
    WorkerSpec,
    fit_worker,
    next_split,
)
from hetero_operator.planner.goodput import LrScaling, choose_global_batch, lr_factor, noise_scale_estimates
from hetero_operator.planner.pipeline import (
    Gpu,
    Layer,
    Link,
    Links,
    PipelinePlan,
    choose_nm,
    partition_pipeline,
)
from hetero_operator.planner.sesgd import group_schedule as sesgd_group_schedule
from hetero_operator.planner.sesgd import ring_position
from hetero_operator.planner.virtual_workers import Allocation, Node, Policy, allocate_virtual_workers
from hetero_operator.planner.wsp import may_start

__all__ = [
    "Allocation",
    "ClusterModel",
    "ContinuousSplit",
    "DreamSchedule",
    "Gpu",
    "Layer",
    "Link",
    "Links",
    "LrScaling",
    "Node",
    "PerfSample",
    "PipelinePlan",
    "PlanningError",
    "Policy",
    "Split",
    "SplitDecision",
    "WarmupStage",
    "WorkerModel",
    "WorkerSpec",
    "allocate_virtual_workers",
    "choose_global_batch",
    "choose_nm",
    "continuous_split",
    "dreamddp_schedule",
    "esync_local_steps",
    "even_split",
    "fit_worker",
    "lr_factor",
    "may_start",
    "next_split",
    "noise_scale_estimates",
    "optimal_split",
    "partition_pipeline",
    "predict_iteration_time",
    "ring_position",
    "sesgd_group_schedule",
    "worker_ready_times",
]
