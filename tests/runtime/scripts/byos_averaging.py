"""The wrapper's step-end averaging on 4 ranks, from parameters set to known per-rank values, under a plan
that splits unevenly (4/1/2/1): sesgd's step replaces each rank's parameters by its group's mean
weighted by samples, and its epoch end by the sample-weighted mean over all ranks; dreamddp's step
averages only the layers of its phase."""

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from rank_group import leave
from torch import nn

from hetero_operator.plan import DreamDDPParams, Plan, SESGDParams, Strategy
from hetero_runtime.strategies.sesgd import GroupSchedule
from hetero_runtime.wrap.averaging import averaging_for

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world)
model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))  # backward order: [1] (output side), then [0]


def set_to(value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def values() -> list[float]:
    return [float(layer.weight.mean()) for layer in (model[1], model[0])]  # backward order


base = Plan(version=1, world_size=world, global_batch=8, local_batches=[4, 1, 2, 1])
sizes = base.local_batches
report = {}
sesgd = base.model_copy(update={"strategy": Strategy.SESGD, "sesgd": SESGDParams(groups=2, seed=5)})
set_to(2.0**rank)
averaging = averaging_for(model, sesgd, rank)
assert averaging is not None
averaging.after_step(sizes)
report["sesgd_step"] = {"got": values(), "members": GroupSchedule(world, 2, 5).members_of(0, rank)}
averaging.end_epoch()
report["sesgd_epoch_end"] = values()
dream = base.model_copy(
    update={"strategy": Strategy.DREAMDDP, "dreamddp": DreamDDPParams(period=2, layer_phases=[[1], [0]])}
)
set_to(2.0**rank)
averaging = averaging_for(model, dream, rank)
assert averaging is not None
averaging.after_step(sizes)  # phase 0: the input-side layer only
report["dreamddp_phase_0"] = values()
averaging.after_step(sizes)  # phase 1: the output-side layer
report["dreamddp_phase_1"] = values()
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps(report))
leave()
