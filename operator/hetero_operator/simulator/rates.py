"""How fast a job trains on the GPUs it holds: the planner's models, exactly as the scheduler scores.

Data-parallel jobs get the planner's optimal batch split over their GPUs (through the scheduler's
cached `predict_data_parallel`, so the simulator and the scheduler share one cache and one model).
HetPipe jobs run one pipeline per virtual worker; the planner's virtual-worker score (workers times
the compute of the slowest one) is taken in the job's own per-GPU samples/s, less a pipeline
efficiency for bubbles and activation transfers.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping

from hetero_operator.planner.virtual_workers import Node, Slot, slowest_worker_throughput
from hetero_operator.resources import Strategy
from hetero_operator.scheduler import Allocation, GPUClassInfo, JobRequest, PriorModel
from hetero_operator.scheduler.throughput import JobShape, predict_data_parallel

# Share of the summed stage throughput a HetPipe pipeline delivers (WSP keeps it mostly full).
HETPIPE_EFFICIENCY = 0.9

Catalog = tuple[GPUClassInfo, ...]


def per_gpu_rate(job: JobRequest, gpu_class: str) -> float:
    """Samples/s of one GPU of ``gpu_class`` at the job's reference local batch (from its profile)."""
    if job.profile is None:
        raise ValueError(f"jobs[{job.key}].profile: the simulator needs a measured profile per class")
    profile = dict(job.profile.per_class)[gpu_class]
    batch = job.global_batch / job.gpus_min
    return 1000.0 * batch / (profile.alpha_ms * batch + profile.beta_ms)


def peak_rate(job: JobRequest, classes: Catalog) -> float:
    """An upper bound on any allocation's samples/s: gpus.max GPUs each at its class's 1/alpha."""
    if job.profile is None:
        raise ValueError(f"jobs[{job.key}].profile: the simulator needs a measured profile per class")
    allowed = {c.name for c in classes if job.allows(c.name)}
    fastest = min(p.alpha_ms for name, p in job.profile.per_class if name in allowed)
    return job.gpus_max * 1000.0 / fastest


def best_single_class_rate(
    job: JobRequest, gpus_per_node: Mapping[str, int], catalog: Catalog, prior: PriorModel
) -> float:
    """The highest samples/s a data-parallel job reaches on GPUs of one class it allows, of any count
    from gpus.min to gpus.max on as few nodes as hold them, with the cluster to itself (0 where no
    count splits its batch). ``gpus_per_node``: GPUs on each node of a class."""
    return best_single_class_set(job, gpus_per_node, catalog, prior)[0]


def best_single_class_set(
    job: JobRequest, gpus_per_node: Mapping[str, int], catalog: Catalog, prior: PriorModel
) -> tuple[float, str | None, int]:
    """`best_single_class_rate`, with the class and GPU count that reach it (the first of equals;
    ``(0, None, 0)`` where no count splits the job's batch)."""
    best: tuple[float, str | None, int] = (0.0, None, 0)
    for gpu_class in gpus_per_node:
        if not job.allows(gpu_class):
            continue
        for size in range(job.gpus_min, job.gpus_max + 1):
            nodes = -(-size // gpus_per_node[gpu_class])
            rate = data_parallel_rate(job, Counter({gpu_class: size}), nodes, catalog, prior) or 0.0
            if rate > best[0]:
                best = (rate, gpu_class, size)
    return best


def data_parallel_rate(
    job: JobRequest, counts: Counter[str], nodes: int, catalog: Catalog, prior: PriorModel
) -> float | None:
    """Samples/s on ``counts`` GPUs per class; ``None`` if the batch cannot be split over them.
    ``catalog`` must be sorted by class name, as the scheduler orders it (shared cache keys)."""
    ordered = tuple((c.name, counts[c.name]) for c in catalog if counts[c.name])
    prediction = predict_data_parallel(JobShape.of(job), ordered, nodes, catalog, prior)
    return None if prediction is None else prediction.samples_per_second


def allocation_rate(job: JobRequest, allocation: Allocation, catalog: Catalog, prior: PriorModel) -> float:
    """Samples/s of ``job`` on ``allocation``; raises if the job cannot run there at all."""
    if job.strategy is Strategy.HETPIPE:
        return _hetpipe_rate(job, allocation)
    rate = data_parallel_rate(
        job, allocation.gpus_per_class(), len(allocation.gpus_per_node()), catalog, prior
    )
    if rate is None:
        raise ValueError(
            f"jobs[{job.key}]: its global batch {job.global_batch} cannot be split over "
            f"{allocation.total_gpus} GPUs within the per-class local batch limits"
        )
    return rate


def _hetpipe_rate(job: JobRequest, allocation: Allocation) -> float:
    rates = {c: per_gpu_rate(job, c) for c in allocation.gpus_per_class()}
    per_node = allocation.gpus_per_node()
    classes = {w.node: w.gpu_class for w in allocation.workers}
    nodes = [Node(n, classes[n], count, rates[classes[n]], 0.0) for n, count in per_node.items()]
    groups: dict[int, list[Slot]] = defaultdict(list)
    used: Counter[str] = Counter()
    for worker in allocation.workers:
        group = worker.virtual_worker if worker.virtual_worker is not None else -1 - worker.rank
        for _ in range(worker.gpus):
            groups[group].append(Slot(worker.node, used[worker.node]))
            used[worker.node] += 1
    score = slowest_worker_throughput(nodes)([tuple(slots) for slots in groups.values()])
    return HETPIPE_EFFICIENCY * score
