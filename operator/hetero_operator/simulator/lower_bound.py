"""A lower bound on a trace's average JCT that every scheduling policy obeys, mixed classes included.

An interval-indexed linear relaxation (Dyer and Wolsey; Hall, Schulz, Shmoys and Wein, "Scheduling to
minimize average completion time", Math. of OR 1997), with GPU classes and arrivals. For job ``j``
(arrival ``a_j``, work ``W_j`` samples) and GPU class ``c``:

- ``z[j,c,k]``: the share of ``W_j`` done on class ``c`` in interval ``k``; the shares sum to 1;
- nothing before the job's release ``r_j = a_j + startup`` (every first start pays the engine's
  start-up before any progress); the interval holding ``r_j`` counts only from ``r_j``;
- capacity: the GPU-seconds ``z * W_j / s[j,c]`` that all jobs use on class ``c`` in an interval are at
  most the class's GPUs times its length; in any interval a job uses at most ``gpus.max`` GPUs, and
  its work on one class is at most its peak ``R_j`` samples/s times the interval's length;
- ``s[j,c]`` (per-GPU credit) and ``R_j`` (peak) bound the samples/s of *every* allocation the job
  may get, mixed classes included: ``rate <= sum over its GPUs of s[j,c]`` and ``rate <= R_j``. See
  `rate_bounds`: a data-parallel job's credit on its best class is its per-GPU rate at gpus.min GPUs
  (the best per-GPU rate of any single-class size); other classes get at least theirs, a little
  more where a GPU among slower ones can take a larger share of the batch. HetPipe jobs are credited
  their pipeline efficiency times each GPU's rate (at least what any pipeline layout delivers). A
  model that a policy may run either way (as pipelines, or data-parallel on the classes it fits)
  gets the larger credit on each class and the larger peak. ``p_j = W_j / R_j``;
- completion: ``C_j >= sum z[j,c,k] * lower(k) + p_j / 2``, ``lower(k)`` the interval's lower end (not
  before ``r_j``): the work-weighted mean time of the job's progress is at least that sum and, the
  job never training faster than ``R_j``, at most ``C_j - p_j / 2``. And ``C_j >= r_j + p_j``
  (isolation: the job alone at its peak).

Minimising the mean of ``C_j - a_j`` gives the bound. It relaxes gangs (a job may hold any fraction
of a GPU, of several classes at once, and take any share of its batch on any of them), integrality
of GPUs, placement on nodes, preemption, resizing and restarts (free), the GPUs a start-up holds,
scheduling cycles, pipelines' stage structure, communication beyond the planner's per-GPU terms, and
where in an interval work happens (only its lower end counts). It holds for any policy that keeps to
each job's gang (gpus.min to gpus.max GPUs of classes it allows), whatever it knows of the speeds:
it is built from the jobs' true (oracle) speeds.

Intervals grow geometrically from each job's release, by about ``2 ** (2 / resolution)`` each (the
default 8: about 19%); `interval_lp` builds and solves the LP and says what the factor trades.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero_operator.scheduler import PriorModel
from hetero_operator.simulator.cluster import Cluster
from hetero_operator.simulator.engine import EngineOptions
from hetero_operator.simulator.interval_lp import (
    DEFAULT_RESOLUTION,
    BoundError,
    BoundJob,
    LowerBound,
    lower_bound_of_jobs,
)
from hetero_operator.simulator.jobs import JobSetupError, SimJob, build_job
from hetero_operator.simulator.rate_bounds import job_rate_bounds
from hetero_operator.simulator.trace import TraceJob

__all__ = [
    "BoundError",
    "BoundJob",
    "LowerBound",
    "bound_job",
    "lower_bound",
    "lower_bound_of_jobs",
    "share_closed",
]


def share_closed(baseline: float, policy: float, bound: float) -> float:
    """The share of `baseline`'s distance to the bound that `policy` closes (average JCTs); NaN
    where the baseline is already at the bound."""
    return (baseline - policy) / (baseline - bound) if baseline > bound else float("nan")


def _ways_to_run(row: TraceJob, cluster: Cluster, prior: PriorModel) -> list[SimJob]:
    """The job as a policy with HetPipe builds it and as one without (distinct where they differ)."""
    ways: list[SimJob] = []
    for pipelines in (True, False):
        try:
            job = build_job(row, cluster, pipelines=pipelines, prior=prior)
        except JobSetupError:
            continue
        if all(job.request != other.request for other in ways):
            ways.append(job)
    if not ways:
        raise BoundError(f"job {row.job_id}: no policy can run it on this cluster (see `simulate`)")
    return ways


def bound_job(row: TraceJob, cluster: Cluster, options: EngineOptions) -> BoundJob:
    """One trace row as the relaxation sees it, from its true speeds."""
    credits: dict[str, float] = {}
    peak = 0.0
    ways = _ways_to_run(row, cluster, options.prior)
    for way in ways:
        mine, fastest = job_rate_bounds(way.request, cluster, options.prior)
        for gpu_class, credit in mine.items():
            credits[gpu_class] = max(credits.get(gpu_class, 0.0), credit)
        peak = max(peak, fastest)
    if peak <= 0:
        raise BoundError(f"job {row.job_id}: no allocation it may use can split its batch")
    return BoundJob(
        job_id=row.job_id,
        arrival_s=row.arrival_s,
        release_s=row.arrival_s + options.startup_s,
        work=ways[0].work_samples,
        credits=tuple((c, s) for c, s in credits.items() if s > 0),
        gpus_max=row.gpus_max,
        peak_rate=peak,
    )


def lower_bound(
    cluster: Cluster,
    trace: Sequence[TraceJob],
    options: EngineOptions | None = None,
    *,
    resolution: int = DEFAULT_RESOLUTION,
) -> LowerBound:
    """The bound on ``trace``'s average JCT on ``cluster`` under the engine's ``options`` (its
    start-up time and prior; knowledge plays no part: the bound uses the true speeds)."""
    chosen = options or EngineOptions()
    jobs = [bound_job(row, cluster, chosen) for row in trace]
    return lower_bound_of_jobs(jobs, cluster.gpus_per_class(), resolution=resolution)
