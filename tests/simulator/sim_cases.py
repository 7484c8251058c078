"""Small clusters and traces shared by the simulator tests."""

from __future__ import annotations

from hetero_operator.simulator.cluster import Cluster, parse_cluster
from hetero_operator.simulator.trace import TraceJob, generate_trace


def three_class_cluster(
    v100_nodes: int = 1, p100_nodes: int = 1, k80_nodes: int = 1, gpus: int = 8
) -> Cluster:
    return parse_cluster(
        {
            "classes": [
                {"name": "v100", "relativeSpeed": 1.0, "memoryGiB": 16},
                {"name": "p100", "relativeSpeed": 0.5, "memoryGiB": 16},
                {"name": "k80", "relativeSpeed": 0.2, "memoryGiB": 12},
            ],
            "nodeGroups": [
                {"gpuClass": "v100", "nodes": v100_nodes, "gpusPerNode": gpus},
                {"gpuClass": "p100", "nodes": p100_nodes, "gpusPerNode": gpus},
                {"gpuClass": "k80", "nodes": k80_nodes, "gpusPerNode": gpus},
            ],
        }
    )


def capacity(cluster: Cluster) -> float:
    return sum(n.gpus_allocatable * cluster.class_info(n.gpu_class).relative_speed for n in cluster.nodes)


def small_trace(seed: int = 3, jobs: int = 40, load: float = 0.8) -> list[TraceJob]:
    return generate_trace(seed, jobs, capacity(three_class_cluster()), load, max_gpus=8)


def row(
    job_id: str,
    model: str,
    gpus: int,
    duration_s: float,
    arrival_s: float = 0.0,
    gpus_max: int | None = None,
) -> TraceJob:
    return TraceJob(
        job_id=job_id,
        arrival_s=arrival_s,
        model=model,
        gpus_min=gpus,
        gpus_max=gpus_max or gpus,
        duration_s=duration_s,
    )
