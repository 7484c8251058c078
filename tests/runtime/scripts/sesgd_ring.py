"""Pure shuffled in-group averaging of x_i = i (no gradients), over the P2P group ring."""

import json
import os
from pathlib import Path

import torch
from rank_group import join, leave

from hetero_runtime.strategies.group_ring import group_ring_sum
from hetero_runtime.strategies.sesgd import GroupSchedule

rank, world, _ = join("gloo")
groups, seed, steps = int(os.environ["GROUPS"]), int(os.environ["SEED"]), int(os.environ["STEPS"])
schedule = GroupSchedule(world, groups, seed)
# A 5-element vector so chunks of unequal size are exercised; element 0 carries x_i = i.
x = torch.tensor([float(rank), 1.0 * rank * rank, -3.0 * rank, 0.5, float(rank) / 3], dtype=torch.float64)
history = []
for step in range(steps):
    members = schedule.members_of(step, rank)
    group_ring_sum(x, members, rank)
    x.div_(len(members))
    history.append(x.tolist())
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps({"history": history}))
leave()
