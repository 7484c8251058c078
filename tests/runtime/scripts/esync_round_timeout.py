"""Two ranks: rank 1 never joins the round's average (a stalled worker); rank 0 must give up after the
round timeout with RoundTimedOut, not wait for the process group's own (60 s) timeout."""

import json
import os
import time
from pathlib import Path

import torch
from rank_group import join

from hetero_runtime.strategies.esync import RoundTimedOut, average_deltas

rank, world, device = join()
result: dict[str, object] = {"rank": rank}
if rank == 0:
    started = time.monotonic()
    try:
        average_deltas(torch.ones(8), world, 3, seconds_left=1.0)
        result["raised"] = None
    except RoundTimedOut as err:
        result["raised"] = str(err)
    result["waited"] = time.monotonic() - started
else:
    time.sleep(6.0)  # stalled: no all-reduce this round
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps(result))
os._exit(0)  # leave without tearing the group down: its peer is gone or stalled
