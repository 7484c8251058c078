"""Helpers to run whole local jobs from tests."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_operator.plan import Plan
from hetero_runtime.local import LocalJob, LocalJobSpec

SPEEDS = [1.0, 0.5, 0.25]


def write_plan_atomically(path: Path, plan_text: str) -> None:
    """Replace the plan file in one rename, as a ConfigMap update appears to a reader."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plan.")
    with os.fdopen(fd, "w") as handle:
        handle.write(plan_text)
    os.replace(tmp, path)


def run_job(
    work_dir: Path,
    plan: Plan,
    epochs: int,
    on_progress: Callable[[LocalJob, dict[str, Any]], None] | None = None,
    speeds: list[float] | None = None,
    timeout: float = 150.0,
    target: str = "digits",
    extra_env: dict[str, str] | None = None,
) -> LocalJob:
    spec = LocalJobSpec(
        target=target,
        speeds=speeds or SPEEDS,
        work_dir=work_dir,
        plan=plan,
        epochs=epochs,
        max_restarts=1,
        extra_env=extra_env or {},
    )
    job: LocalJob

    def forward(payload: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress(job, payload)

    job = LocalJob(spec, on_progress=forward)
    code = job.run(timeout)
    logs = "\n".join(spec.log_file(r).read_text()[-3000:] for r in range(spec.workers))
    assert code == 0, f"job failed with {code}; logs:\n{logs}"
    return job


def read_logs(job: LocalJob) -> str:
    return "\n".join(job.spec.log_file(r).read_text() for r in range(job.spec.workers))
