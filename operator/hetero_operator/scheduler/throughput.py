"""Predicted training throughput of a job on a candidate GPU set.

Each GPU becomes a planner worker model: from the job's measured profile where it has one, else
from the class's ``relative_speed`` prior. The planner's batch split gives the iteration time and
throughput is ``global_batch / iteration time``. HetPipe jobs are scored by the planner's
virtual-worker grouping instead. Predictions depend only on the job's shape and the *shape* of the
GPU set (GPUs per class, node count), never on node names, so they are cached across jobs and cycles.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as settings

from hetero_operator.planner.batch import ClusterModel, WorkerModel, optimal_split
from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.virtual_workers import (
    Node,
    Policy,
    allocate_virtual_workers,
    choose_virtual_worker_size,
)
from hetero_operator.resources import AllocationPolicy, Strategy
from hetero_operator.scheduler.snapshot import ClassProfile, GPUClassInfo, JobRequest, MeasuredProfile

PREDICTION_CACHE_SIZE = 1 << 16


@settings(frozen=True)
class PriorModel:
    """Performance of a job nobody has measured yet, for a GPU of relative speed 1.0 (ms).

    Compute per iteration is ``ms_per_sample*b + fixed_ms`` divided by the GPU's relative speed; the
    first gradient bucket is ready after ``sync_fraction`` of it. A ring all-reduce of the gradients
    costs ``allreduce_ms_*`` times ``2(n-1)/n``; cross-node links are slower than links inside a node,
    which is what makes fewer nodes faster. The last bucket (``last_bucket_fraction``) never overlaps.
    """

    ms_per_sample: Annotated[
        float, Field(gt=0, description="Compute per sample on a GPU of speed 1 (ms).")
    ] = 10.0
    fixed_ms: Annotated[
        float, Field(ge=0, description="Fixed compute per step on a GPU of speed 1 (ms).")
    ] = 20.0
    sync_fraction: Annotated[
        float, Field(ge=0, le=1, description="Share of the compute after which the first bucket is ready.")
    ] = 0.5
    allreduce_ms_one_node: Annotated[
        float, Field(ge=0, description="All-reduce of the gradients inside one node (ms, before 2(n-1)/n).")
    ] = 10.0
    allreduce_ms_across_nodes: Annotated[
        float, Field(ge=0, description="All-reduce across nodes (ms, before 2(n-1)/n).")
    ] = 60.0
    last_bucket_fraction: Annotated[
        float, Field(ge=0, le=1, description="Share of the all-reduce that never overlaps compute.")
    ] = 0.25

    def allreduce_ms(self, workers: int, nodes: int) -> tuple[float, float]:
        """(t_o, t_u) for ``workers`` GPUs spread over ``nodes`` nodes."""
        if workers <= 1:
            return 0.0, 0.0
        per_volume = self.allreduce_ms_one_node if nodes <= 1 else self.allreduce_ms_across_nodes
        total = per_volume * 2.0 * (workers - 1) / workers
        last = self.last_bucket_fraction * total
        return total - last, last


@dataclass(frozen=True, slots=True)
class JobShape:
    """The parts of a job that decide its throughput; hashable, so it can key the caches."""

    strategy: Strategy
    global_batch: int
    max_local_batch: tuple[tuple[str, int], ...]
    virtual_worker_size: int | None  # HetPipe's; None: the planner picks it
    allocation_policy: AllocationPolicy
    profile: MeasuredProfile | None

    @classmethod
    def of(cls, job: JobRequest) -> JobShape:
        return cls(
            strategy=job.strategy,
            global_batch=job.global_batch,
            max_local_batch=tuple(sorted(job.max_local_batch.items())),
            virtual_worker_size=job.virtual_worker_size if job.strategy is Strategy.HETPIPE else 1,
            allocation_policy=job.allocation_policy,
            profile=job.profile,
        )

    def local_batch_cap(self, gpu_class: str) -> int | None:
        for name, cap in self.max_local_batch:
            if name == gpu_class:
                return cap
        return None


@dataclass(frozen=True, slots=True)
class Prediction:
    samples_per_second: float
    iteration_ms: float


@dataclass(frozen=True, slots=True)
class VirtualWorkerLayout:
    """HetPipe grouping found by the planner; GPUs are named by (position in node list, index)."""

    prediction: Prediction
    policy: str
    virtual_workers: tuple[tuple[tuple[int, int], ...], ...]


# A GPU set's shape: GPUs per class (class order fixed by the caller) and the number of nodes.
ClassCounts = tuple[tuple[str, int], ...]
Catalog = tuple[GPUClassInfo, ...]


def _class_model(
    shape: JobShape, info: GPUClassInfo, catalog: Catalog, prior: PriorModel
) -> tuple[float, float, float, float]:
    """(alpha, beta, alpha_sync, beta_sync) of one GPU of ``info``'s class for this job."""
    if shape.profile is not None:
        measured = dict(shape.profile.per_class)
        if info.name in measured:
            return _coefficients(measured[info.name], 1.0)
        # Scale the first measured class (in name order) by the ratio of speed priors.
        speeds = {c.name: c.relative_speed for c in catalog}
        for name, profile in shape.profile.per_class:
            if name in speeds:
                return _coefficients(profile, speeds[name] / info.relative_speed)
    slow = 1.0 / info.relative_speed
    compute_per_sample, compute_fixed = prior.ms_per_sample * slow, prior.fixed_ms * slow
    return (
        compute_per_sample,
        compute_fixed,
        prior.sync_fraction * compute_per_sample,
        prior.sync_fraction * compute_fixed,
    )


def class_rate_per_gpu(job: JobRequest, info: GPUClassInfo, catalog: Catalog, prior: PriorModel) -> float:
    """Samples/s of one GPU of ``info``'s class at the job's gang-size local batch, by the model the
    predictions use: measured, else a measured class scaled by the priors, else the prior. One unit
    for every class, so a measured class and an unmeasured one compare."""
    alpha, beta, _, _ = _class_model(JobShape.of(job), info, catalog, prior)
    batch = job.global_batch / job.gpus_min
    return 1000.0 * batch / (alpha * batch + beta)


def _coefficients(profile: ClassProfile, scale: float) -> tuple[float, float, float, float]:
    return (
        profile.alpha_ms * scale,
        profile.beta_ms * scale,
        profile.alpha_sync_ms * scale,
        profile.beta_sync_ms * scale,
    )


@lru_cache(maxsize=PREDICTION_CACHE_SIZE)
def predict_data_parallel(
    shape: JobShape, counts: ClassCounts, nodes: int, catalog: Catalog, prior: PriorModel
) -> Prediction | None:
    """Throughput with one worker per GPU and the planner's optimal batch split; ``None`` when the
    global batch cannot be split (fewer samples than GPUs, or above the per-class batch caps)."""
    by_name = {c.name: c for c in catalog}
    workers: list[WorkerModel] = []
    for gpu_class, count in counts:
        alpha, beta, alpha_sync, beta_sync = _class_model(shape, by_name[gpu_class], catalog, prior)
        model = WorkerModel(
            alpha, beta, alpha_sync, beta_sync, max_batch=shape.local_batch_cap(gpu_class), name=gpu_class
        )
        workers.extend([model] * count)
    if not workers or len(workers) > shape.global_batch:
        return None
    if shape.profile is not None and len(workers) > 1:
        t_o, t_u = shape.profile.t_o_ms, shape.profile.t_u_ms
    else:
        t_o, t_u = prior.allreduce_ms(len(workers), nodes)
    try:
        split = optimal_split(ClusterModel(tuple(workers), t_o, t_u), shape.global_batch)
    except PlanningError:
        return None
    return Prediction(shape.global_batch * 1000.0 / split.iteration_time, split.iteration_time)


@lru_cache(maxsize=PREDICTION_CACHE_SIZE)
def predict_virtual_workers(
    shape: JobShape, node_counts: ClassCounts, catalog: Catalog, prior: PriorModel
) -> VirtualWorkerLayout | None:
    """HetPipe: group the GPUs (``node_counts``: class and GPU count per node, in order) into virtual
    workers with the planner under the job's policy. Throughput is the planner's score (speed-1.0
    GPUs' worth of compute) times the samples per second of one speed-1.0 GPU."""
    by_name = {c.name: c for c in catalog}
    nodes = [
        Node(f"n{i}", gpu_class, count, by_name[gpu_class].relative_speed, by_name[gpu_class].memory_gib)
        for i, (gpu_class, count) in enumerate(node_counts)
    ]
    try:
        policy = Policy(shape.allocation_policy.value)
        if shape.virtual_worker_size is None:
            layout = choose_virtual_worker_size(nodes, policy)
        else:
            layout = allocate_virtual_workers(nodes, shape.virtual_worker_size, policy)
    except PlanningError:
        return None
    samples_per_second = layout.score * 1000.0 / prior.ms_per_sample
    per_sample_ms = 1000.0 / samples_per_second if samples_per_second > 0 else float("inf")
    virtual_workers = tuple(
        tuple((int(slot.node[1:]), slot.gpu_index) for slot in worker) for worker in layout.virtual_workers
    )
    return VirtualWorkerLayout(
        Prediction(samples_per_second, per_sample_ms * shape.global_batch),
        layout.policy.value,
        virtual_workers,
    )


def clear_prediction_caches() -> None:
    """Forget cached predictions (benchmarks measure cold cycles with this)."""
    predict_data_parallel.cache_clear()
    predict_virtual_workers.cache_clear()
