"""A training script run as the command of a job's one worker, on the GPU the worker is given."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hetero_operator.plan import Strategy
from hetero_runtime.local import LocalJob, LocalJobSpec, initial_plan


def run_on_the_gpu(work: Path, name: str, script: str, args: list[str], batch: int) -> dict[str, Any]:
    """Run `script ARGS --out FILE` as one worker with `HETEROTRAIN_DEVICE=auto`; the metrics it wrote."""
    out = work / "out.json"
    spec = LocalJobSpec(
        target=name,
        speeds=[1.0],
        work_dir=work,
        plan=initial_plan(Strategy.DATA, [1.0], batch),
        max_restarts=0,
        extra_env={"HETEROTRAIN_DEVICE": "auto"},
        command=[sys.executable, script, *args, "--out", str(out)],
    )
    code = LocalJob(spec).run(240)
    assert code == 0, spec.log_file(0).read_text()[-3000:]
    return dict(json.loads(out.read_text()))
