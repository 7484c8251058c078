"""Three ranks calibrate through `calibrate_solo` with a fake strategy whose work sleeps (rank + 1) x
4 ms per sample; each records when it calibrated, its own figure and the one all ranks share."""

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from rank_group import join, leave

from hetero_operator.plan import Plan
from hetero_runtime.calibration import calibrate_solo
from hetero_runtime.simulate import per_sample_seconds

rank, world, _ = join("gloo")
record: dict = {"rank": rank}


class SleepingStrategy:
    symmetric = True

    def calibrate(self, plan: Plan) -> dict[str, float]:
        record["started"] = time.time()
        cost = per_sample_seconds(lambda: time.sleep(0.004 * (rank + 1) * 4), samples=4, repeats=3)
        record["ended"] = time.time()
        record["own"] = cost
        return {"step": cost}


ctx = SimpleNamespace(world_size=world, rank=rank, device=torch.device("cpu"))
plan = Plan(version=0, world_size=world, global_batch=12, local_batches=[4, 4, 4])
record["common"] = calibrate_solo(SleepingStrategy(), plan, ctx)  # type: ignore[arg-type]
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps(record))
leave()
