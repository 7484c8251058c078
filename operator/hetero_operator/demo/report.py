"""The demo's final report, from what rank 0 printed per epoch and the plans the operator wrote."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class EpochRow:
    epoch: int
    plan_version: int
    local_batches: list[int]
    samples_per_second: float
    wall_seconds: float
    accuracy: float | None


def epoch_rows(progress: Sequence[Mapping[str, Any]], plans: Mapping[int, Sequence[int]]) -> list[EpochRow]:
    """One row per finished epoch. Global samples: what the runtime's rank 0 reports the epoch
    covered over every rank (`global_samples`); for a script's own loop, which reports its own samples
    only, steps x the plan's global batch (its short last step counted whole). A later line for the
    same epoch (after a restart) replaces the earlier one."""
    rows: dict[int, EpochRow] = {}
    for line in progress:
        version = int(line["plan_version"])
        batches = list(plans.get(version, []))
        wall = float(line["wall_seconds"])
        samples = int(line.get("global_samples") or (int(line["steps"]) * sum(batches) if batches else 0))
        rows[int(line["epoch"])] = EpochRow(
            epoch=int(line["epoch"]),
            plan_version=version,
            local_batches=batches,
            samples_per_second=samples / wall if wall > 0 else 0.0,
            wall_seconds=wall,
            accuracy=(line.get("evaluation") or {}).get("accuracy"),
        )
    return [rows[e] for e in sorted(rows)]


def speedup_vs_first_plan(rows: Sequence[EpochRow], steady_epochs: int = 3) -> float | None:
    """Steady-state throughput (median of the last epochs) over the best epoch of the job's first
    plan (the split it started with); taking its best epoch keeps start-up costs out of the baseline.
    """
    first_version = rows[0].plan_version if rows else None
    even = [r.samples_per_second for r in rows if r.plan_version == first_version]
    later = [r.samples_per_second for r in rows if r.plan_version != first_version]
    if not even or not later:
        return None
    return statistics.median(later[-steady_epochs:]) / max(even)


def rank_speeds(split: Sequence[int], compute_seconds: Mapping[int, float]) -> list[float] | None:
    """Each rank's samples per second of compute (its share of `split` over its mean compute time),
    or None while a rank has no time yet: a speed missing from the list would shift the ranks after it."""
    if not split or any(not compute_seconds.get(rank) for rank in range(len(split))):
        return None
    return [share / compute_seconds[rank] for rank, share in enumerate(split)]


def baseline_comparison(
    rows: Sequence[EpochRow],
    baseline: Sequence[EpochRow],
    baseline_speeds: Mapping[str, float],
    own_speeds: Mapping[str, float],
    shares: Mapping[str, float],
    steady_epochs: int = 3,
) -> dict[str, Any]:
    """The job against a baseline run: the same job on the same nodes, rebalancing off, on the split
    `shares` (each node's share of the global batch; a node without one is left idle).

    Each run calibrates its simulated base device when it starts, so two runs of the same job can pace
    to bases a few percent apart; the baseline's samples/s is brought to the job's base by the median
    node's ratio of the compute speeds each measured (`baseline_speeds`, `own_speeds`: samples/s of
    compute per node). The ideal is what the job's measured speeds allow over the baseline's split:
    every worker busy all step takes 1 / sum(v) per sample, the baseline max(share / v) (it waits
    for its slowest share), so ideal = sum(v) * max(share / v); for the even split sum(v) / (n min v),
    for the fastest node alone sum(v) / v_fastest. Comparing against more than the ideal is a broken
    measurement, which the report keeps visible (`of_ideal` above 1)."""
    raw = statistics.median([r.samples_per_second for r in baseline][-steady_epochs:]) if baseline else 0.0
    # The median node's ratio: one node's mean can be off when an epoch's short last step is split
    # unevenly, and the base is the same for every node.
    ratios = [own_speeds[n] / v for n, v in baseline_speeds.items() if v > 0 and own_speeds.get(n)]
    base_ratio = statistics.median(ratios) if ratios else None
    steady = raw * base_ratio if base_ratio is not None else 0.0
    used = {node: share for node, share in shares.items() if share > 0}
    known = bool(used) and all(own_speeds.get(node, 0) > 0 for node in used)
    ideal = sum(own_speeds.values()) * max(s / own_speeds[n] for n, s in used.items()) if known else None
    per_epoch = [r.samples_per_second / steady if steady > 0 else None for r in rows]
    later = [x for x in per_epoch[-steady_epochs:] if x is not None]
    speedup = statistics.median(later) if later else None
    return {
        "shares": dict(shares),
        "samples_per_second": [round(r.samples_per_second, 2) for r in baseline],
        "raw_steady_samples_per_second": round(raw, 2),
        "measured_speeds": {n: round(v, 2) for n, v in baseline_speeds.items()},
        "own_speeds": {n: round(v, 2) for n, v in own_speeds.items()},
        "base_ratio": base_ratio,
        "steady_samples_per_second": round(steady, 2),
        "ideal_speedup": ideal,
        "speedup_per_epoch": per_epoch,
        "speedup": speedup,
        "of_ideal": speedup / ideal if speedup is not None and ideal else None,
        "of_ideal_per_epoch": [x / ideal if x is not None and ideal else None for x in per_epoch],
    }


def control_comparison(
    rows: Sequence[EpochRow],
    control: Sequence[EpochRow],
    control_speeds: Sequence[float],
    own_speeds: Sequence[float],
    steady_epochs: int = 3,
) -> dict[str, Any]:
    """The job against its even-split control run, by rank: `baseline_comparison` with every rank's
    share equal, its speeds kept as lists in rank order."""
    comparable = bool(control_speeds) and len(control_speeds) == len(own_speeds) and min(control_speeds) > 0
    ranks = [str(rank) for rank in range(len(control_speeds))]
    compared = baseline_comparison(
        rows,
        control,
        dict(zip(ranks, control_speeds, strict=True)) if comparable else {},
        dict(zip(ranks, own_speeds, strict=True)) if comparable else {},
        dict.fromkeys(ranks, 1 / len(ranks)) if comparable else {},
        steady_epochs,
    )
    del compared["shares"]
    return {
        **compared,
        "measured_speeds": [round(v, 2) for v in control_speeds],
        "own_speeds": [round(v, 2) for v in own_speeds],
    }


def build_report(rows: Sequence[EpochRow], rebalances: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    final = next((r.accuracy for r in reversed(rows) if r.accuracy is not None), None)
    return {
        "epochs": len(rows),
        "per_epoch": [asdict(r) for r in rows],
        "local_batches": [r.local_batches for r in rows],
        "samples_per_second": [round(r.samples_per_second, 2) for r in rows],
        "speedup_vs_first_plan": speedup_vs_first_plan(rows),
        "final_accuracy": final,
        "rebalances": list(rebalances),
    }


def plot(rows: Sequence[EpochRow], path: Path) -> Path:
    """Local batch per worker (stacked) and measured throughput, per epoch."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [r.epoch for r in rows]
    workers = max((len(r.local_batches) for r in rows), default=0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    base = [0] * len(rows)
    for rank in range(workers):
        heights = [r.local_batches[rank] if rank < len(r.local_batches) else 0 for r in rows]
        top.bar(epochs, heights, bottom=base, label=f"rank {rank}")
        base = [b + h for b, h in zip(base, heights, strict=True)]
    top.set_ylabel("local batch")
    top.set_title("Per-worker local batch and throughput, per epoch")
    top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    bottom.plot(epochs, [r.samples_per_second for r in rows], marker="o")
    bottom.set_ylabel("samples / s")
    bottom.set_xlabel("epoch")
    bottom.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
