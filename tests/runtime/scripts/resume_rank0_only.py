"""One rank of a resumed job whose checkpoint volume only rank 0 mounts: it reads the worker
environment the operator sets, restores through the runtime and writes what it starts from to
OUT_DIR/rank-N.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from rank_group import leave

from hetero_runtime.checkpoint import restore_newest
from hetero_runtime.launcher import parse_worker_env

env = parse_worker_env(os.environ)
dist.init_process_group("gloo", init_method=env.init_method, rank=env.rank, world_size=env.world_size)
torch.manual_seed(100 + env.rank)  # fresh models differ per rank: only the restore can align them
model = torch.nn.Linear(4, 3)
_, state = restore_newest(env.checkpoint_dir, env.rank, env.world_size)
if state is not None:
    model.load_state_dict(state["model"])
started = {
    "checkpoint_dir": None if env.checkpoint_dir is None else str(env.checkpoint_dir),
    "epochs_done": None if state is None else state["epochs_done"],
    "model": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
}
Path(os.environ["OUT_DIR"], f"rank-{env.rank}.json").write_text(json.dumps(started))
leave()
