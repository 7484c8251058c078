"""What a step ends with under the local-SGD strategies, when the loop is the user's: each rank has
taken its own optimizer step (with its own clipping, GradScaler and scheduler), and the parameters
are then averaged as the strategy says, before the next batch is handed out.

- `sesgd`: inside the step's shuffled groups (the planner's shared-seed schedule, no messages),
  weighted by the ranks' samples in the step, as the runtime's `sesgd` weighs them.
- `dreamddp`: the layers whose phase of the period has come; every layer at least once per period.

Both end an epoch with one full average, so evaluation, checkpoints and plan changes see one model.
The schedules and collectives are the runtime's strategies' own; what differs from the runtime's loop
is only where the averaging runs (after the script's optimizer step, not inside backward).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import Plan, Strategy
from hetero_operator.planner.dreamddp import phase_of_step, schedule
from hetero_runtime.strategies.base import average_model, copy_from_flat, flat_parameters, trainable
from hetero_runtime.strategies.dreamddp import layers_in_backward_order
from hetero_runtime.strategies.group_ring import weighted_group_mean
from hetero_runtime.strategies.sesgd import GroupSchedule

LOCAL_STEP_STRATEGIES = frozenset({Strategy.SESGD, Strategy.DREAMDDP, Strategy.ESYNC})
"""Each rank steps on its own gradient (`esync` averages at the end of its rounds, see `esync_rounds`)."""


class ParameterAveraging(Protocol):
    steps: int  # steps taken under this job (the schedules run on the global step)

    def after_step(self, sizes: Sequence[int]) -> None:
        """The step's optimizer step is done; `sizes`: every rank's samples in it."""

    def end_epoch(self) -> None: ...


class GroupAveraging:
    """`sesgd`: replace the parameters by their sample-weighted mean over this step's group (a ring
    inside it)."""

    def __init__(self, model: nn.Module, plan: Plan, rank: int, steps: int = 0) -> None:
        assert plan.sesgd is not None
        self.model, self.rank, self.world = model, rank, plan.world_size
        self.params = trainable(model)
        self.schedule = GroupSchedule(plan.world_size, plan.sesgd.groups, plan.sesgd.seed)
        self.epoch_weight = plan.local_batches[rank] / plan.global_batch
        self.steps = steps

    def after_step(self, sizes: Sequence[int]) -> None:
        if self.world > 1:
            members = self.schedule.members_of(self.steps, self.rank)
            with torch.no_grad():
                flat = flat_parameters(self.params)
                weighted_group_mean(flat, members, self.rank, sizes)
                copy_from_flat(self.params, flat)
        self.steps += 1

    def end_epoch(self) -> None:
        average_model(self.model, self.world, self.epoch_weight)


def layer_parameters(model: nn.Module) -> list[list[nn.Parameter]]:
    """Each layer's own trainable parameters, in the runtime's DreamDDP layer order."""
    return [
        [p for p in layer.parameters(recurse=False) if p.requires_grad]
        for layer in layers_in_backward_order(model)
    ]


def size_proxied_phases(model: nn.Module, period: int) -> list[list[int]]:
    """The planner's DreamDDP schedule with each layer's backward and all-reduce time taken as
    proportional to its parameter count: a script's model is not profiled, and every rank derives the
    same schedule from the same model without a message."""
    sizes = [float(sum(p.numel() for p in params)) for params in layer_parameters(model)]
    scale = 1.0 / max(sum(sizes), 1.0)
    costs = [size * scale for size in sizes]
    phases = schedule(period, sum(costs), costs, costs).phases_of_layer()
    return [phases.get(index, [0]) for index in range(len(sizes))]


class LayerPhaseAveraging:
    """`dreamddp`: at step t, average the layers scheduled in phase t mod H (partial local SGD)."""

    def __init__(self, model: nn.Module, plan: Plan, steps: int = 0) -> None:
        assert plan.dreamddp is not None
        self.model, self.world = model, plan.world_size
        self.layer_params = layer_parameters(model)
        self.period = plan.dreamddp.period
        phases = plan.dreamddp.layer_phases
        if phases is None:
            phases = size_proxied_phases(model, self.period)
        elif len(phases) != len(self.layer_params):
            raise ValueError(
                f"dreamddp.layer_phases has {len(phases)} entries but the model has "
                f"{len(self.layer_params)} layers with parameters"
            )
        self.layer_phases = [list(p) for p in phases]
        self.steps = steps

    def after_step(self, sizes: Sequence[int]) -> None:
        del sizes  # every rank's layer counts alike, as in the runtime's dreamddp
        phase = phase_of_step(self.steps, self.period)
        if self.world > 1:
            handles, averaged = [], []
            for layer, params in enumerate(self.layer_params):  # the same order on every rank
                if phase in self.layer_phases[layer]:
                    handles += [dist.all_reduce(p.data, async_op=True) for p in params]
                    averaged += params
            for handle in handles:
                handle.wait()
            with torch.no_grad():
                for param in averaged:
                    param.data.div_(self.world)
        self.steps += 1

    def end_epoch(self) -> None:
        average_model(self.model, self.world)


def averaging_for(model: nn.Module, plan: Plan, rank: int, steps: int = 0) -> ParameterAveraging | None:
    """The averaging a plan's strategy ends each step with; None for `data` (gradients are synchronised
    in backward instead)."""
    if plan.strategy is Strategy.SESGD:
        return GroupAveraging(model, plan, rank, steps)
    if plan.strategy is Strategy.DREAMDDP:
        return LayerPhaseAveraging(model, plan, steps)
    return None
