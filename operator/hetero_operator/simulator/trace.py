"""Job traces: generated from a seed, or loaded from (and saved to) CSV.

One row per job: ``job_id, arrival_s, model, gpus_min, gpus_max, duration_s, priority[, gpu_classes][,
tenant][, workload]``.
``duration_s`` is how long the job runs on ``gpus_min`` V100 GPUs (the reference class), which fixes
its amount of work; the simulator turns it into samples to process. ``gpu_classes`` (optional
column) restricts the job to those GPU classes, ``|``-separated in preference order (``a100|v100``),
as ``spec.gpuClasses`` does; empty means any class. ``model`` is one of `workloads.MODELS`.
``tenant`` (optional column) is the queue the job is submitted to, as ``spec.queue`` is; empty or
absent means ``default``.
``workload`` (optional column) is the job's workload key, as ``spec.workload`` (or the key the
operator derives from image and command) is: jobs with the same key run the same model the same way,
so what one measured the throughput catalog gives the next. Empty or absent means a key of the job's
own (nothing measured before it helps it); a key must always name the same model.

```
job_id,arrival_s,model,gpus_min,gpus_max,duration_s,priority,gpu_classes
job-00000,0.0,resnet50,4,8,3600,0,
job-00001,60.5,bert,1,2,1800,1,a100|v100
```

Generated traces follow the shape of public GPU-cluster traces (e.g. Microsoft's Philly trace,
"Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN Training Workloads", ATC 2019): most jobs
use one GPU and few use many, and durations are heavy-tailed (log-normal, minutes to days).
Arrivals are Poisson with the rate that offers the requested load. A share of the jobs
(``REPEAT_SHARE``) run a workload an earlier job of the trace ran; see there for the sources.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from hetero_operator.simulator.cluster import Cluster
from hetero_operator.simulator.workloads import MODELS

CLASS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

COLUMNS = (
    "job_id",
    "arrival_s",
    "model",
    "gpus_min",
    "gpus_max",
    "duration_s",
    "priority",
    "gpu_classes",
    "tenant",
    "workload",
)
REQUIRED_COLUMNS = COLUMNS[:-3]
DEFAULT_TENANT = "default"
CLASS_SEPARATOR = "|"

# (GPUs, probability): single-GPU jobs dominate, a few use many GPUs.
SIZE_MIX = ((1, 0.45), (2, 0.15), (4, 0.18), (8, 0.14), (16, 0.05), (32, 0.03))
MEDIAN_DURATION_S = 1800.0
DURATION_SIGMA = 1.4
DURATION_RANGE_S = (120.0, 86400.0)
ELASTIC_FACTORS = (1, 1, 2, 4)
HIGH_PRIORITY_SHARE = 0.1
# Share of generated jobs restricted to a subset of the cluster's classes (as spec.gpuClasses does).
CONSTRAINED_SHARE = 1 / 3
# Share of generated jobs that rerun an earlier job's workload (same code, same model: the same key).
# Published analyses find recurrence common but give no one figure that fits a key as the operator
# derives it, so this is an assumption, held below what they describe:
# - Alibaba PAI (Weng et al., "MLaaS in the Wild", NSDI 2022; trace alibaba/clusterdata,
#   cluster-trace-gpu-v2020): instances whose entry script, command-line parameters and data
#   sources match share a `group` tag and "are considered as repeated instances" (the trace's
#   README); the paper predicts recurring tasks' durations from their history.
# - Helios (Hu et al., "Characterization and Prediction of Deep Learning Workloads in Large-Scale
#   GPU Datacenters", SC 2021): its Quasi-Shortest-Service-First scheduler predicts a job from the
#   history of earlier, similar jobs, which pays only because such jobs keep coming back.
# - Philly (Jeon et al., ATC 2019), whose sizes and durations the generator follows, gives no
#   recurrence rate.
# Half the jobs is the assumption (not a published figure): a new key is a model trained in a way
# the cluster has not seen, and is measured from scratch.
REPEAT_SHARE = 0.5


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
    gpu_classes: tuple[str, ...] = ()
    tenant: str = Field(default=DEFAULT_TENANT, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    workload: str = Field(default="", max_length=253, pattern=r"^([a-z0-9]([-.a-z0-9]*[a-z0-9])?)?$")

    @property
    def workload_key(self) -> str:
        """The key the throughput catalog knows the job by: its workload, else one of its own."""
        return self.workload or f"job/{self.job_id}"

    @field_validator("tenant", mode="before")
    @classmethod
    def _default_tenant(cls, value: object) -> object:
        return DEFAULT_TENANT if value is None or value == "" else value

    @field_validator("workload", mode="before")
    @classmethod
    def _empty_workload(cls, value: object) -> object:
        return "" if value is None else value

    @field_validator("gpu_classes", mode="before")
    @classmethod
    def _split_classes(cls, value: object) -> object:
        if value is None:
            return ()
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(CLASS_SEPARATOR)) if value.strip() else ()
        return value

    @model_validator(mode="after")
    def _check(self) -> TraceJob:
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; use one of {', '.join(sorted(MODELS))}")
        if self.gpus_max < self.gpus_min:
            raise ValueError(f"gpus_max: must be >= gpus_min ({self.gpus_min}), got {self.gpus_max}")
        bad = [c for c in self.gpu_classes if not CLASS_NAME.fullmatch(c)]
        if bad or len(set(self.gpu_classes)) != len(self.gpu_classes):
            raise ValueError(
                f"gpu_classes: {CLASS_SEPARATOR.join(self.gpu_classes)!r} must be distinct lowercase class "
                f"names separated by {CLASS_SEPARATOR!r} (e.g. a100{CLASS_SEPARATOR}v100), or empty for any"
            )
        return self


def generate_trace(
    seed: int,
    jobs: int,
    capacity: float,
    load: float = 0.9,
    *,
    max_gpus: int = 32,
    models: Sequence[str] = tuple(MODELS),
    cluster: Cluster | None = None,
) -> list[TraceJob]:
    """``jobs`` jobs whose reference work arrives at ``load`` times ``capacity`` (V100-equivalent GPUs,
    i.e. sum of GPUs times relative speed). ``max_gpus`` caps the size of one job. With ``cluster``,
    about a third of the jobs are restricted to a random subset of the classes that can hold them
    (the model fits one GPU, and the class has gpus_min GPUs)."""
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
    constrained = rng.random(jobs) < CONSTRAINED_SHARE
    # Drawn for every job so the other columns do not depend on whether a cluster is given.
    subset_draws = rng.random((jobs, 2))
    # Drawn last, so that every other column is what it was before traces had workload keys.
    workloads = workload_keys([str(m) for m in chosen_models], rng.random((jobs, 2)))
    return [
        TraceJob(
            job_id=f"job-{i:05d}",
            arrival_s=round(float(arrivals[i]), 3),
            model=str(chosen_models[i]),
            gpus_min=int(sizes[i]),
            gpus_max=int(min(max_gpus, sizes[i] * factors[i])),
            duration_s=round(float(durations[i]), 3),
            priority=int(priorities[i]),
            gpu_classes=(
                _class_subset(cluster, str(chosen_models[i]), int(sizes[i]), subset_draws[i])
                if cluster is not None and constrained[i]
                else ()
            ),
            workload=workloads[i],
        )
        for i in range(jobs)
    ]


def workload_keys(models: Sequence[str], draws: np.ndarray) -> list[str]:
    """One workload key per job (``draws``: two uniform numbers per job): with probability
    ``REPEAT_SHARE`` an earlier job's key of the same model, picked uniformly among those keys,
    else a new key (``<model>-w<n>``). The first job of a model always gets a new key."""
    keys: list[str] = []
    earlier: dict[str, list[str]] = {}
    created = 0
    for model, (repeat, pick) in zip(models, draws, strict=True):
        same_model = earlier.setdefault(model, [])
        if same_model and repeat < REPEAT_SHARE:
            keys.append(same_model[int(pick * len(same_model))])
            continue
        keys.append(f"{model}-w{created:04d}")
        same_model.append(keys[-1])
        created += 1
    return keys


def _class_subset(cluster: Cluster, model: str, gpus: int, draws: np.ndarray) -> tuple[str, ...]:
    """One or two of the classes that can hold the job, in the cluster's listed order; () if fewer
    than two classes can (a restriction to the only possible class would change nothing)."""
    totals = cluster.gpus_per_class()
    able = [c.name for c in cluster.classes if MODELS[model].fits(c) and totals[c.name] >= gpus]
    if len(able) < 2:
        return ()
    size = 1 + int(draws[0] * min(2, len(able) - 1))
    start = int(draws[1] * len(able))
    picked = {able[(start + k) % len(able)] for k in range(size)}
    return tuple(c for c in able if c in picked)


def trace_to_csv(jobs: Sequence[TraceJob]) -> str:
    out = io.StringIO()
    # The optional columns only when some job sets them (older traces stay as they were).
    left_out = {
        name
        for name, used in (
            ("tenant", any(job.tenant != DEFAULT_TENANT for job in jobs)),
            ("workload", any(job.workload for job in jobs)),
        )
        if not used
    }
    fieldnames = [c for c in COLUMNS if c not in left_out]
    writer = csv.DictWriter(out, fieldnames=fieldnames, lineterminator="\n")
    writer.writeheader()
    for job in jobs:
        row = job.model_dump()
        row["gpu_classes"] = CLASS_SEPARATOR.join(job.gpu_classes)
        writer.writerow({name: row[name] for name in fieldnames})
    return out.getvalue()


def trace_from_csv(text: str, known_classes: Sequence[str] | None = None) -> list[TraceJob]:
    """Rows of a trace CSV; with ``known_classes`` (the cluster's), a row naming another class in
    ``gpu_classes`` fails with its line."""
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
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
        unknown = [c for c in jobs[-1].gpu_classes if known_classes is not None and c not in known_classes]
        if unknown:
            raise TraceError(
                f"line {line}: gpu_classes: unknown class(es) {', '.join(unknown)}; use classes of the "
                f"cluster ({', '.join(known_classes or ())}) or leave the column empty for any class"
            )
    ids = [j.job_id for j in jobs]
    if len(set(ids)) != len(ids):
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        raise TraceError(f"job_id: must be unique, repeated: {', '.join(repeated[:5])}")
    if not jobs:
        raise TraceError("trace: no jobs; add at least one row under the header")
    return sorted(jobs, key=lambda j: (j.arrival_s, j.job_id))


def load_trace(path: Path, known_classes: Sequence[str] | None = None) -> list[TraceJob]:
    return trace_from_csv(path.read_text(), known_classes)


def save_trace(jobs: Sequence[TraceJob], path: Path) -> None:
    path.write_text(trace_to_csv(jobs))
