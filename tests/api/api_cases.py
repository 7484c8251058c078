"""Builders shared by the API and CLI tests."""

from __future__ import annotations

from typing import Any


def job_spec(
    gpus_min: int,
    gpus_max: int | None = None,
    classes: list[str] | None = None,
    *,
    priority: int = 0,
    global_batch: int = 128,
    strategy: str = "data",
) -> dict[str, Any]:
    """A HeteroTrainJob spec in wire form (what a manifest holds)."""
    return {
        "image": "heterotrain/trainer:0.1.0",
        "command": ["heterotrain", "worker", "digits"],
        "gpus": {"min": gpus_min, "max": gpus_max or gpus_min},
        "gpuClasses": list(classes or []),
        "parallelism": {"strategy": strategy},
        "batch": {"global": global_batch},
        "epochs": 3,
        "priority": priority,
    }


def two_class_pool(fast_gpus: int = 4, slow_gpus: int = 4, slow_nodes: int = 1) -> dict[str, Any]:
    """A request pool: one fast node and ``slow_nodes`` slow nodes (4x slower)."""
    nodes: list[dict[str, Any]] = [{"name": "fast-0", "gpuClass": "fast", "gpus": fast_gpus}]
    nodes += [{"name": f"slow-{i}", "gpuClass": "slow", "gpus": slow_gpus} for i in range(slow_nodes)]
    return {
        "classes": [
            {"name": "fast", "relativeSpeed": 1.0, "memoryGiB": 80, "costWeight": 4},
            {"name": "slow", "relativeSpeed": 0.25, "memoryGiB": 16, "costWeight": 1},
        ],
        "nodes": nodes,
    }
