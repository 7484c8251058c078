"""Shared cases: the three-GPU cluster of Cannikin's checked examples."""

from __future__ import annotations

from hetero_operator.planner.batch import ClusterModel, WorkerModel

# (name, q, s, k, m) with gamma = 0.25, t_o = 40 ms, t_u = 5 ms
THREE_GPUS = [("fast", 0.2, 3.0, 0.4, 5.0), ("mid", 0.4, 4.0, 0.8, 6.0), ("slow", 0.7, 5.0, 1.4, 30.0)]


def three_gpu_cluster(min_batch: int = 0) -> ClusterModel:
    return ClusterModel(
        tuple(
            WorkerModel.from_components(q, s, k, m, 0.25, min_batch=min_batch, name=n)
            for n, q, s, k, m in THREE_GPUS
        ),
        t_o=40.0,
        t_u=5.0,
    )
