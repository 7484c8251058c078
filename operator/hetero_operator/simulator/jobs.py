"""Trace rows become the scheduler's `JobRequest`s, sized in samples of work.

A job's work is what its trace duration buys on ``gpus_min`` V100 GPUs (the reference class). How a
job may run depends on the policy: every policy runs a model data-parallel on the classes where one
replica fits; a policy that builds HetPipe virtual workers also runs models that do not fit the
smallest class, as pipelines of ``k`` GPUs whose memory together holds the model.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import GPUClassInfo, JobRequest, PriorModel
from hetero_operator.simulator.cluster import Cluster
from hetero_operator.simulator.rates import data_parallel_rate, peak_rate
from hetero_operator.simulator.trace import TraceJob
from hetero_operator.simulator.workloads import ModelProfile, model_named

REFERENCE_CLASS = GPUClassInfo("v100", 1.0, 16.0)
NAMESPACE = "sim"


class JobSetupError(ValueError):
    """A trace job cannot run on this cluster under this policy; the message says why."""


@dataclass(frozen=True, slots=True)
class SimJob:
    """A trace job ready to simulate: its request (never placed yet), work and bounds."""

    trace: TraceJob
    model: ModelProfile
    request: JobRequest
    work_samples: float
    peak_samples_per_s: float
    checkpoint_s: float

    @property
    def key(self) -> str:
        return self.request.key

    @property
    def ideal_runtime_s(self) -> float:
        """No allocation can finish the work faster than this."""
        return self.work_samples / self.peak_samples_per_s


def build_job(trace: TraceJob, cluster: Cluster, *, pipelines: bool, prior: PriorModel) -> SimJob:
    model = model_named(trace.model)
    unknown = [c for c in trace.gpu_classes if c not in cluster.class_names]
    if unknown:
        raise JobSetupError(
            f"job {trace.job_id}: gpu_classes names {', '.join(unknown)}, not a class of the cluster "
            f"({', '.join(cluster.class_names)}); fix the trace row or the cluster file"
        )
    # The row's classes, in its preference order; no restriction means every class of the cluster.
    usable = trace.gpu_classes or cluster.class_names
    fitting = tuple(c for c in usable if model.fits(cluster.class_info(c)))
    smallest = min(cluster.class_info(c).memory_gib for c in usable)
    stages = math.ceil(model.memory_gib / smallest)
    common = dict(
        key=f"{NAMESPACE}/{trace.job_id}",
        gpus_min=trace.gpus_min,
        gpus_max=trace.gpus_max,
        global_batch=model.batch_per_gpu * trace.gpus_min,
        created_at=trace.arrival_s,
        priority=trace.priority,
        queue=trace.tenant,
        max_local_batch={c.name: model.local_batch_cap(c) for c in cluster.classes if model.fits(c)},
        profile=model.measured_profile((*cluster.classes, REFERENCE_CLASS)),
    )
    if stages > 1 and pipelines and trace.gpus_max >= stages:
        request = JobRequest(
            **common,  # type: ignore[arg-type]
            strategy=Strategy.HETPIPE,
            virtual_worker_size=stages,
            allowed_classes=trace.gpu_classes,
        )
    elif fitting:
        allowed = () if len(fitting) == len(cluster.classes) else fitting
        request = JobRequest(**common, allowed_classes=allowed)  # type: ignore[arg-type]
    else:
        largest = max(cluster.class_info(c).memory_gib for c in usable)
        raise JobSetupError(
            f"job {trace.job_id}: model {model.name} needs {model.memory_gib} GiB per replica but the "
            f"largest GPU it may use has {largest} GiB; allow larger classes in gpu_classes, or use a "
            f"policy with HetPipe virtual workers and gpus_max >= {stages}"
        )
    reference = JobRequest(**common)  # type: ignore[arg-type]
    catalog = (REFERENCE_CLASS,)
    nodes = max(1, math.ceil(trace.gpus_min / 8))
    reference_rate = data_parallel_rate(reference, Counter({"v100": trace.gpus_min}), nodes, catalog, prior)
    if reference_rate is None:
        raise JobSetupError(f"job {trace.job_id}: its batch cannot be split over {trace.gpus_min} V100 GPUs")
    return SimJob(
        trace=trace,
        model=model,
        request=request,
        work_samples=trace.duration_s * reference_rate,
        peak_samples_per_s=peak_rate(request, cluster.classes),
        checkpoint_s=model.checkpoint_s,
    )
