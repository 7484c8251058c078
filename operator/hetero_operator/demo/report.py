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
    """One row per finished epoch. Global samples = steps x the plan's global batch (rank 0 prints
    its own samples only); a later line for the same epoch (after a restart) replaces the earlier one."""
    rows: dict[int, EpochRow] = {}
    for line in progress:
        version = int(line["plan_version"])
        batches = list(plans.get(version, []))
        wall = float(line["wall_seconds"])
        samples = int(line["steps"]) * sum(batches) if batches else 0
        rows[int(line["epoch"])] = EpochRow(
            epoch=int(line["epoch"]),
            plan_version=version,
            local_batches=batches,
            samples_per_second=samples / wall if wall > 0 else 0.0,
            wall_seconds=wall,
            accuracy=(line.get("evaluation") or {}).get("accuracy"),
        )
    return [rows[e] for e in sorted(rows)]


def speedup_vs_even(rows: Sequence[EpochRow], steady_epochs: int = 3) -> float | None:
    """Steady-state throughput (median of the last epochs) over the best epoch of the first plan.

    The first plan is the even split; taking its best epoch keeps start-up costs out of the baseline.
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


def control_comparison(
    rows: Sequence[EpochRow],
    control: Sequence[EpochRow],
    control_speeds: Sequence[float],
    own_speeds: Sequence[float],
    steady_epochs: int = 3,
) -> dict[str, Any]:
    """The job against its control run (the same job, rebalancing off, on the same nodes).

    Each run calibrates its simulated base device when it starts, so two runs of the same job can pace
    to bases a few percent apart; the control's samples/s is brought to the job's base by the ratio of
    the speeds each measured under the same even split. The ideal is that of the speeds measured under
    the control (every worker busy all step, against the even split, which waits for the slowest):
    sum(v) / (n min v)."""
    raw = statistics.median([r.samples_per_second for r in control][-steady_epochs:]) if control else 0.0
    comparable = bool(control_speeds) and len(control_speeds) == len(own_speeds) and min(control_speeds) > 0
    # The median rank's ratio: one rank's mean can be off when an epoch's short last step is split
    # unevenly, and the base is the same for every rank.
    ratios = [own / ctrl for own, ctrl in zip(own_speeds, control_speeds, strict=False)] if comparable else []
    base_ratio = statistics.median(ratios) if ratios else None
    steady = raw * base_ratio if base_ratio is not None else 0.0
    slowest = min(control_speeds) if control_speeds else 0.0
    ideal = sum(control_speeds) / (len(control_speeds) * slowest) if slowest > 0 else None
    per_epoch = [r.samples_per_second / steady if steady > 0 else None for r in rows]
    later = [x for x in per_epoch[-steady_epochs:] if x is not None]
    speedup = statistics.median(later) if later else None
    return {
        "samples_per_second": [round(r.samples_per_second, 2) for r in control],
        "raw_steady_samples_per_second": round(raw, 2),
        "measured_speeds": [round(v, 2) for v in control_speeds],
        "own_speeds": [round(v, 2) for v in own_speeds],
        "base_ratio": base_ratio,
        "steady_samples_per_second": round(steady, 2),
        "ideal_speedup": ideal,
        "speedup_per_epoch": per_epoch,
        "speedup": speedup,
        "of_ideal": speedup / ideal if speedup is not None and ideal else None,
        "of_ideal_per_epoch": [x / ideal if x is not None and ideal else None for x in per_epoch],
    }


def build_report(rows: Sequence[EpochRow], rebalances: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    final = next((r.accuracy for r in reversed(rows) if r.accuracy is not None), None)
    return {
        "epochs": len(rows),
        "per_epoch": [asdict(r) for r in rows],
        "local_batches": [r.local_batches for r in rows],
        "samples_per_second": [round(r.samples_per_second, 2) for r in rows],
        "speedup_vs_even_epoch": speedup_vs_even(rows),
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
