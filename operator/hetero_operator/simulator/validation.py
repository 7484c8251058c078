"""Does the simulator's throughput model match a real run? Check it against the runtime benchmark.

The runtime benchmark (``bench/runtime_balance.py``) trains one model on three workers of unequal
speed, first with an even split and then with the planner's split, and records per phase each
worker's local batch, compute time and communication time, and the measured samples/s. The
simulator predicts a phase's samples/s the way it predicts every job's: the planner's iteration
time (``predict_iteration_time``) for that split, with each worker's linear model taken from its
measured compute time and the all-reduce time of the worker that waited least (its time is pure
communication; the others' also holds waiting for the slowest). Learnt from the phase it predicts,
this cannot fail by much; `balance_prediction` predicts the balanced phase from the even one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hetero_operator.planner import ClusterModel, WorkerModel, predict_iteration_time

TOLERANCE = 0.10


@dataclass(frozen=True, slots=True)
class PhaseComparison:
    phase: str
    predicted_samples_per_s: float
    measured_samples_per_s: float

    @property
    def relative_error(self) -> float:
        return abs(self.predicted_samples_per_s - self.measured_samples_per_s) / self.measured_samples_per_s

    @property
    def within_tolerance(self) -> bool:
        return self.relative_error <= TOLERANCE


def predict_phase(phase: dict[str, Any]) -> float:
    """Samples/s the planner's model predicts for one recorded phase of the runtime benchmark."""
    try:
        batches = [int(b) for b in phase["local_batches"]]
        compute_ms = [float(t) for t in phase["worker_compute_ms"]]
        comm_ms = [float(t) for t in phase["worker_comm_ms"]]
    except KeyError as exc:
        raise ValueError(f"phase.{exc.args[0]}: missing from the runtime benchmark result") from exc
    if not (len(batches) == len(compute_ms) == len(comm_ms)) or not batches:
        raise ValueError(
            "phase: local_batches, worker_compute_ms and worker_comm_ms must have one entry per worker"
        )
    # Per-sample time from the measurement; the sync point is the end of compute (no overlap).
    workers = tuple(
        WorkerModel(t / b, 0.0, t / b, 0.0, name=f"rank{i}")
        for i, (b, t) in enumerate(zip(batches, compute_ms, strict=True))
    )
    iteration_ms = predict_iteration_time(ClusterModel(workers, 0.0, min(comm_ms)), batches)
    return sum(batches) * 1000.0 / iteration_ms


def compare_runtime_benchmark(
    result: dict[str, Any], phases: tuple[str, ...] = ("even", "data")
) -> list[PhaseComparison]:
    """Predicted against measured samples/s for the named phases of a runtime benchmark result."""
    comparisons = []
    for name in phases:
        if name not in result:
            raise ValueError(
                f"{name}: phase missing from the runtime benchmark result (run bench/runtime_balance.py)"
            )
        phase = result[name]
        comparisons.append(PhaseComparison(name, predict_phase(phase), float(phase["samples_per_s"])))
    return comparisons
