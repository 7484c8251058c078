"""What a simulation run means: job completion times, queueing, makespan, utilisation; and plots."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetero_operator.simulator.engine import SimulationResult


def summarize(result: SimulationResult) -> dict[str, Any]:
    """JSON-ready metrics. Times in seconds; ``utilisation`` is allocated GPU time over capacity
    times makespan (per class and overall); ``slowdown`` is JCT over the job's ideal runtime."""
    jct = np.array([o.jct_s for o in result.outcomes])
    queueing = np.array([o.queueing_delay_s for o in result.outcomes])
    slowdown = jct / np.array([o.ideal_runtime_s for o in result.outcomes])
    first_arrival = min(o.arrival_s for o in result.outcomes)
    last_finish = max(o.jct_s + o.arrival_s for o in result.outcomes)
    makespan = last_finish - first_arrival
    per_class = {
        name: (result.busy_gpu_seconds[name] / (gpus * makespan) if gpus and makespan > 0 else 0.0)
        for name, gpus in result.capacity.items()
    }
    total_gpus = sum(result.capacity.values())
    overall = sum(result.busy_gpu_seconds.values()) / (total_gpus * makespan) if makespan > 0 else 0.0
    return {
        "policy": result.policy,
        "jobs": len(result.outcomes),
        "avg_jct": float(jct.mean()),
        "p50_jct": float(np.percentile(jct, 50)),
        "p99_jct": float(np.percentile(jct, 99)),
        "makespan": float(makespan),
        "avg_queueing_delay": float(queueing.mean()),
        "p99_queueing_delay": float(np.percentile(queueing, 99)),
        "avg_slowdown": float(slowdown.mean()),
        "utilisation": float(overall),
        "utilisation_per_class": {k: float(v) for k, v in per_class.items()},
        "jobs_on_mixed_classes": sum(1 for o in result.outcomes if len(o.classes_used) > 1),
        "restarts": sum(o.restarts for o in result.outcomes),
        "preemptions": result.preemptions,
        "resizes": result.resizes,
        "scheduling_cycles": result.cycles,
        "wall_seconds": result.wall_seconds,
    }


def plot_jct_cdf(results: Sequence[SimulationResult], path: Path) -> None:
    """Empirical CDF of job completion time, one line per policy (log time axis)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    for result in results:
        hours = np.sort([o.jct_s / 3600.0 for o in result.outcomes])
        axes.step(hours, np.arange(1, len(hours) + 1) / len(hours), where="post", label=result.policy)
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours)")
    axes.set_ylabel("fraction of jobs")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_utilisation(result: SimulationResult, path: Path) -> None:
    """Share of each class's GPUs allocated over time (step plot)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.0))
    times = np.array([t for t, _ in result.timeline]) / 3600.0
    for name, gpus in result.capacity.items():
        if gpus == 0:
            continue
        used = np.array([counts.get(name, 0) for _, counts in result.timeline]) / gpus
        axes.step(times, used, where="post", label=name, linewidth=0.8)
    axes.set_ylim(0, 1.05)
    axes.set_xlabel("time (hours)")
    axes.set_ylabel("GPUs allocated (share of class)")
    axes.set_title(f"utilisation over time: {result.policy}")
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_plots(results: Sequence[SimulationResult], out_dir: Path) -> list[Path]:
    """``jct_cdf.png`` plus ``utilisation_<policy>.png`` for each run; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "jct_cdf.png"]
    plot_jct_cdf(results, written[0])
    for result in results:
        path = out_dir / f"utilisation_{result.policy}.png"
        plot_utilisation(result, path)
        written.append(path)
    return written
