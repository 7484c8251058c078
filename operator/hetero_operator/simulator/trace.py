"""Job traces: generated from a seed, or loaded from (and saved to) CSV.

One row per job: ``job_id, arrival_s, model, gpus_min, gpus_max, duration_s, priority``.
``duration_s`` is how long the job runs on ``gpus_min`` V100 GPUs (the reference class), which fixes
its amount of work; the simulator turns it into samples to process.

Generated traces follow the shape of public GPU-cluster traces (e.g. Microsoft's Philly trace,
"Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", ATC 2019): most jobs
use one GPU and few use many, and durations are heavy-tailed (log-normal, minutes to days).
Arrivals are Poisson with the rate that offers the requested load.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetero_operator.simulator.workloads import MODELS

COLUMNS = ("job_id", "arrival_s", "model", "gpus_min", "gpus_max", "duration_s", "priority")

# (GPUs, probability): single-GPU jobs dominate, a few use many GPUs.
SIZE_MIX = ((1, 0.45), (2, 0.15), (4, 0.18), (8, 0.14), (16, 0.05), (32, 0.03))
MEDIAN_DURATION_S = 1800.0
DURATION_SIGMA = 1.4
DURATION_RANGE_S = (120.0, 86400.0)
ELASTIC_FACTORS = (1, 1, 2, 4)
HIGH_PRIORITY_SHARE = 0.1


class TraceError(ValueError):
    """A trace row is malformed; the message names the row, the column and the fix."""


class TraceJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: str = Field(min_length=1, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    arrival_s: float = Field(ge=0, allow_inf_nan=False)
    model: str
    gpus_min: int = Field(ge=1)
    gpus_max: int = Field(ge=1)
    duration_s: float = Field(gt=0, allow_inf_nan=False)
    priority: int = 0

    @model_validator(mode="after")
    def _check(self) -> TraceJob:
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; known: {', '.join(sorted(MODELS))}")
        if self.gpus_max < self.gpus_min:
            raise ValueError(f"gpus_max: must be >= gpus_min ({self.gpus_min}), got {self.gpus_max}")
        return self


def generate_trace(
    seed: int,
    jobs: int,
    capacity: float,
    load: float = 0.9,
    *,
    max_gpus: int = 32,
    models: Sequence[str] = tuple(MODELS),
) -> list[TraceJob]:
    """``jobs`` jobs whose reference work arrives at ``load`` times ``capacity`` (V100-equivalent GPUs,
    i.e. sum of GPUs times relative speed). ``max_gpus`` caps the size of one job."""
    if jobs < 1 or capacity <= 0 or load <= 0:
        raise TraceError("jobs, capacity and load must be positive")
    rng = np.random.default_rng(seed)
    sizes_allowed = [(g, p) for g, p in SIZE_MIX if g <= max_gpus] or [(1, 1.0)]
    weights = np.array([p for _, p in sizes_allowed])
    sizes = rng.choice([g for g, _ in sizes_allowed], size=jobs, p=weights / weights.sum())
    durations = np.clip(
        rng.lognormal(np.log(MEDIAN_DURATION_S), DURATION_SIGMA, size=jobs), *DURATION_RANGE_S
    )
    rate = load * capacity / float(np.mean(sizes * durations))  # jobs per second
    arrivals = np.cumsum(rng.exponential(1.0 / rate, size=jobs))
    arrivals -= arrivals[0]
    chosen_models = rng.choice(list(models), size=jobs)
    factors = rng.choice(ELASTIC_FACTORS, size=jobs)
    priorities = (rng.random(jobs) < HIGH_PRIORITY_SHARE).astype(int)
    return [
        TraceJob(
            job_id=f"job-{i:05d}",
            arrival_s=round(float(arrivals[i]), 3),
            model=str(chosen_models[i]),
            gpus_min=int(sizes[i]),
            gpus_max=int(min(max_gpus, sizes[i] * factors[i])),
            duration_s=round(float(durations[i]), 3),
            priority=int(priorities[i]),
        )
        for i in range(jobs)
    ]


def trace_to_csv(jobs: Sequence[TraceJob]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for job in jobs:
        writer.writerow(job.model_dump())
    return out.getvalue()


def trace_from_csv(text: str) -> list[TraceJob]:
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"header: missing column(s) {', '.join(missing)}; expected {','.join(COLUMNS)}")
    jobs: list[TraceJob] = []
    for line, row in enumerate(reader, start=2):
        extra = sorted(k for k in row if k not in COLUMNS)
        if extra:
            raise TraceError(f"line {line}: unknown column(s) {', '.join(map(str, extra))}")
        try:
            jobs.append(TraceJob.model_validate(row))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            raise TraceError(f"line {line}: {where + ': ' if where else ''}{message}") from exc
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise TraceError(f"job_id: must be unique, repeated: {', '.join(repeated[:5])}")
    if not jobs:
        raise TraceError("trace: no jobs; add at least one row under the header")
    return sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))


def load_trace(path: Path) -> list[TraceJob]:
    return trace_from_csv(path.read_text())


def save_trace(jobs: Sequence[TraceJob], path: Path) -> None:
    path.write_text(trace_to_csv(jobs))
