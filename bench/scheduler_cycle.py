"""Latency of one pure scheduling cycle at cluster scale.

1,000 nodes x 8 GPUs in 4 classes; half the GPUs already run jobs; 500 jobs wait in 4 queues with
mixed sizes, class lists, priorities and strategies. Each cycle gets a freshly generated snapshot
(a different seed). "cold" cycles start with empty prediction caches; "warm" cycles re-run the same
snapshots with the caches the previous cycles filled (what a long-running operator sees).

    python bench/scheduler_cycle.py [--cycles 12] [--write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from benchmarks_md import replace_section
from hetero_operator.resources import AllocationPolicy, Strategy
from hetero_operator.scheduler import (
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    SchedulerConfig,
    Snapshot,
    clear_prediction_caches,
    schedule,
)
from progress import Steps, steps

CLASSES = (
    GPUClassInfo("a100", 2.0, 80, cost_weight=4.0),
    GPUClassInfo("v100", 1.0, 32, cost_weight=2.0),
    GPUClassInfo("l4", 0.8, 24, cost_weight=1.0),
    GPUClassInfo("t4", 0.5, 16, cost_weight=0.5),
)
NODES_PER_CLASS = 250
GPUS_PER_NODE = 8
QUEUED_JOBS = 500
SECTION = "## Scheduler cycle"


def _request(rng: random.Random, key: str, arrived: float, any_class: bool = False) -> JobRequest:
    size = rng.choice([1, 1, 2, 2, 4, 4, 8, 8, 16, 32])
    names = [c.name for c in CLASSES]
    allowed = tuple(rng.sample(names, rng.randint(1, 4))) if rng.random() < 0.7 and not any_class else ()
    hetpipe = rng.random() < 0.1 and size >= 2
    return JobRequest(
        key=key,
        gpus_min=size,
        gpus_max=size * rng.choice([1, 1, 2, 4]),
        global_batch=rng.choice([256, 512, 1024, 2048]),
        created_at=arrived,
        queue=f"q{rng.randrange(4)}",
        priority=rng.choice([0, 0, 0, 1, 2]),
        allowed_classes=allowed,
        strategy=Strategy.HETPIPE if hetpipe else Strategy.DATA,
        virtual_worker_size=2 if hetpipe else None,
        allocation_policy=AllocationPolicy.AUTO,
        max_local_batch={"t4": 64} if rng.random() < 0.2 and (not allowed or "t4" in allowed) else {},
    )


def build_snapshot(seed: int, running_jobs: int, any_class: bool = False) -> Snapshot:
    """Jobs already running (placed by the scheduler itself, so consistent) plus 500 queued."""
    rng = random.Random(seed)
    nodes = tuple(
        NodeInfo(f"{c.name}-{i:04d}", c.name, GPUS_PER_NODE) for c in CLASSES for i in range(NODES_PER_CLASS)
    )
    warmup = tuple(_request(rng, f"run/job-{i}", float(i)) for i in range(running_jobs))
    placed = schedule(Snapshot(CLASSES, nodes, warmup), SchedulerConfig(elastic=False))
    running = tuple(replace(j, current=placed.place[j.key]) for j in warmup if j.key in placed.place)
    queued = tuple(_request(rng, f"queue/job-{i}", 1000.0 + i, any_class) for i in range(QUEUED_JOBS))
    return Snapshot(CLASSES, nodes, (*running, *queued), now=2000.0)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# name -> (jobs already running, queued jobs accept any class so nobody is left waiting and growth runs)
SCENARIOS = {
    "empty cluster": (0, False),
    "empty, any class (elastic growth runs)": (0, True),
    "about half busy": (400, False),
    "crowded": (1200, False),
}


def run(cycles: int, running_jobs: int, any_class: bool, progress: Steps) -> dict[str, object]:
    """One scenario: `cycles` snapshots built, then one cold and one warm cycle on each (3 x `cycles`
    progress steps)."""
    snapshots = []
    for seed in range(cycles):
        snapshots.append(build_snapshot(seed, running_jobs, any_class))
        progress.done()
    cold, warm = [], []
    outcome = None
    for snapshot in snapshots:
        clear_prediction_caches()
        started = time.perf_counter()
        outcome = schedule(snapshot)
        cold.append(time.perf_counter() - started)
        progress.done()
    for snapshot in snapshots:
        started = time.perf_counter()
        schedule(snapshot)
        warm.append(time.perf_counter() - started)
        progress.done()
    assert outcome is not None
    last = snapshots[-1]
    running_gpus = sum(j.current.total_gpus for j in last.jobs if j.current is not None)
    return {
        "cycles": cycles,
        "cold": cold,
        "warm": warm,
        "running_jobs": sum(1 for j in last.jobs if j.current is not None),
        "running_gpus": running_gpus,
        "placed": len(outcome.place),
        "placed_above_min": sum(
            1 for j in last.jobs if j.key in outcome.place and outcome.place[j.key].total_gpus > j.gpus_min
        ),
        "waiting": len(outcome.unschedulable),
        "grown": len(outcome.grow),
        "preempted": len(outcome.preempt),
        "shrunk": len(outcome.shrink),
    }


def report(results: dict[str, dict[str, object]]) -> str:
    gpus = NODES_PER_CLASS * len(CLASSES) * GPUS_PER_NODE
    cycles = next(iter(results.values()))["cycles"]
    lines = [
        SECTION,
        "",
        f"`python bench/scheduler_cycle.py --write`: one pure `schedule()` call over "
        f"{NODES_PER_CLASS * len(CLASSES)} nodes x {GPUS_PER_NODE} GPUs ({gpus} GPUs, 4 classes) with "
        f"{QUEUED_JOBS} jobs queued in 4 queues (10% hetpipe, mixed sizes 1-32 GPUs, class lists and "
        "priorities). "
        f"{cycles} cycles per scenario, each on a different generated snapshot; cold cycles start with empty "
        "prediction caches, warm ones keep the caches of earlier cycles as a running operator does.",
        "",
        "| scenario | running jobs (GPUs) | cycle | p50 ms | p99 ms | max ms "
        "| placed (of them above gpus.min) / waiting / preempted / shrunk / grown |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        for label in ("cold", "warm"):
            values = result[label]
            assert isinstance(values, list)
            lines.append(
                f"| {name} | {result['running_jobs']} ({result['running_gpus']}) | {label} | "
                f"{statistics.median(values) * 1000:.0f} | {_percentile(values, 0.99) * 1000:.0f} | "
                f"{max(values) * 1000:.0f} | {result['placed']} ({result['placed_above_min']}) / "
                f"{result['waiting']} / {result['preempted']} / {result['shrunk']} / {result['grown']} |"
            )
    lines += ["", "Decision counts are from the last snapshot. Target: p99 < 1 s on the 2-core machine.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=12)
    parser.add_argument("--write", action="store_true", help="write the section into BENCHMARKS.md")
    args = parser.parse_args()
    results = {}
    with steps("scheduler cycles", 3 * args.cycles * len(SCENARIOS)) as progress:
        for name, (running_jobs, any_class) in SCENARIOS.items():
            progress.doing(name)
            results[name] = run(args.cycles, running_jobs, any_class, progress)
    text = report(results)
    print(text)
    if args.write:
        replace_section(text)


if __name__ == "__main__":
    main()
