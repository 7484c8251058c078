"""Pure shuffled in-group averaging of x_i = i (no gradients), over the P2P group ring, weighted by
each rank's samples (SIZES, by rank)."""

import json
import os
from pathlib import Path

import torch
from rank_group import join, leave

from hetero_runtime.strategies.group_ring import weighted_group_mean
from hetero_runtime.strategies.sesgd import GroupSchedule

rank, world, _ = join("gloo")
groups, seed, steps = int(os.environ["GROUPS"]), int(os.environ["SEED"]), int(os.environ["STEPS"])
sizes = [int(b) for b in os.environ["SIZES"].split(",")]
schedule = GroupSchedule(world, groups, seed)
# A 5-element vector so chunks of unequal size are exercised; element 0 carries x_i = i.
x = torch.tensor([float(rank), 1.0 * rank * rank, -3.0 * rank, 0.5, float(rank) / 3], dtype=torch.float64)
history = []
for step in range(steps):
    members = schedule.members_of(step, rank)
    weighted_group_mean(x, members, rank, sizes)
    history.append(x.tolist())
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps({"history": history}))
leave()
