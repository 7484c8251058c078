"""Planner solve times: batch split, pipeline partition, DreamDDP schedule.

Prints JSON (median of repeats, milliseconds, measured with time.perf_counter). ``--quick`` runs
fewer repeats; ``--markdown FILE`` also writes the "## Planner" section of that file.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks_md import replace_section
from hetero_operator.planner.batch import ClusterModel, WorkerModel, optimal_split, predict_iteration_time
from hetero_operator.planner.dreamddp import schedule
from hetero_operator.planner.pipeline import Gpu, Layer, Link, Links, partition_pipeline
from progress import Steps, steps

LINKS = Links(same_node=Link(0.01, 10.0), cross_node=Link(0.5, 3.0))


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def random_cluster(n: int, rng: np.random.Generator) -> ClusterModel:
    speeds = rng.choice([1.0, 2.0, 4.0], size=n)  # a 1:2:4 mix of GPU classes
    workers = tuple(
        WorkerModel.from_components(
            0.1 * s, 2.0 * s, 0.2 * s, 3.0 * s, 0.25, min_batch=1, max_batch=4096, name=f"w{i}"
        )
        for i, s in enumerate(speeds * rng.uniform(0.9, 1.1, size=n))
    )
    return ClusterModel(workers, t_o=30.0, t_u=4.0)


def random_layers(n: int, rng: np.random.Generator) -> list[Layer]:
    return [
        Layer(
            time_ms=float(rng.uniform(0.5, 5.0)),
            activation_mb=float(rng.uniform(1.0, 50.0)),
            param_mb=float(rng.uniform(1.0, 100.0)),
            stash_mb=float(rng.uniform(5.0, 200.0)),
        )
        for _ in range(n)
    ]


BATCH_SIZES = (8, 64, 1000)
CASES = 3 * len(BATCH_SIZES) + 3


def timed(progress: Steps, case: str, fn: Callable[[], object], repeats: int) -> dict[str, Any]:
    progress.doing(case)
    result = {"case": case, "median_ms": median_ms(fn, repeats)}
    progress.done(case)
    return result


def batch_cases(cl: ClusterModel, repeats: int, progress: Steps) -> list[dict[str, Any]]:
    n, total = cl.size, 64 * cl.size
    split = optimal_split(cl, total)
    return [
        timed(
            progress,
            f"batch ClusterModel build, {n} workers",
            lambda: ClusterModel(cl.workers, cl.t_o, cl.t_u),
            repeats,
        ),
        timed(progress, f"batch optimal_split, {n} workers", lambda: optimal_split(cl, total), repeats),
        timed(
            progress,
            f"batch predict_iteration_time, {n} workers",
            lambda: predict_iteration_time(cl, split.local_batches),
            repeats,
        ),
    ]


def bench(repeats: int, progress: Steps) -> dict[str, Any]:
    rng = np.random.default_rng(2024)
    out: dict[str, Any] = {"repeats": repeats, "python": platform.python_version(), "results": []}
    for n in BATCH_SIZES:
        out["results"].extend(batch_cases(random_cluster(n, rng), repeats, progress))
    layers = random_layers(64, rng)
    four = [Gpu(f"g{i}", s, 20000.0, f"node{i % 2}") for i, s in enumerate([1.0, 0.8, 0.5, 0.3])]
    out["results"].append(
        timed(
            progress,
            "pipeline 64 layers x 4 GPUs (24 orders, pruned search)",
            lambda: partition_pipeline(layers, four, 4, LINKS),
            max(1, repeats // 5),
        )
    )
    classes = [("a100", 1.0, 40000.0, 3), ("v100", 0.6, 16000.0, 3), ("t4", 0.3, 16000.0, 2)]
    eight = [Gpu(f"{c}-{j}", s, m, f"node-{c}") for c, s, m, count in classes for j in range(count)]
    out["results"].append(
        timed(
            progress,
            "pipeline 64 layers x 8 GPUs, 3 classes (560 distinct orders, pruned search)",
            lambda: partition_pipeline(layers, eight, 4, LINKS),
            max(1, repeats // 10),
        )
    )
    bp = list(rng.uniform(0.5, 5.0, 100))
    comm = list(rng.uniform(0.5, 8.0, 100))
    out["results"].append(
        timed(progress, "dreamddp 100 layers, H=8", lambda: schedule(8, 20.0, bp, comm), repeats)
    )
    return out


def markdown(result: dict[str, Any]) -> str:
    rows = "\n".join(f"| {r['case']} | {r['median_ms']:.3f} |" for r in result["results"])
    return (
        "## Planner\n\n"
        f"`python bench/planner.py` (median of {result['repeats']} repeats after one warm-up, "
        f"time.perf_counter, Python {result['python']}, 2-core machine).\n\n"
        "| Case | Median solve time (ms) |\n|---|---|\n"
        f"{rows}\n\n"
        "Targets: batch for 1,000 workers under 10 ms; pipeline 64x4 under 1 s and 64x8 (3 classes) "
        "under 5 s; DreamDDP 100 layers with H=8 under 1 s.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    parser.add_argument("--markdown", type=Path, help="write the '## Planner' section of this file")
    args = parser.parse_args()
    with steps("planner cases", CASES) as progress:
        result = bench(repeats=5 if args.quick else 50, progress=progress)
    print(json.dumps(result, indent=2))
    if args.markdown:
        replace_section(markdown(result), args.markdown)


if __name__ == "__main__":
    main()
