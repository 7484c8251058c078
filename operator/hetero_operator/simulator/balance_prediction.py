"""Can the planner predict a balanced run from the even run alone? A check that can fail.

`validation.py` predicts each phase of a runtime benchmark from that same phase's measurements, so it
only checks the arithmetic of the iteration time. Here the model is learnt from the even-split phase
alone, exactly as the rebalancer learns it from a job's first round (`rebalance.decide.speed_model`:
each worker's compute per sample as a line through the origin, the all-reduce from
`planner.fitting.fit_communication`), then OptPerf (`planner.optimal_split`) chooses the split, and
both are compared with the balanced phase the same run measured afterwards: the split, and the
samples/s at the predicted split and at the split the run really used.

What one even phase cannot give: a fixed per-step compute cost (it needs a second batch size per
worker; the model has none), when the first gradient bucket is ready (the benchmarks sync after the
backward pass, so compute end is taken), the last bucket's all-reduce alone (taken as 0), and any
per-step time outside compute and all-reduce (the optimizer step, launching the step), which the
planner does not model. The even phase's own error (`even_error`) shows how much of that there is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero_operator.planner import (
    ClusterModel,
    PerfSample,
    WorkerSpec,
    optimal_split,
    predict_iteration_time,
)
from hetero_operator.rebalance.decide import speed_model


@dataclass(frozen=True, slots=True)
class MeasuredPhase:
    """One phase of a runtime benchmark run: per worker, in rank order (times in ms per step)."""

    local_batches: tuple[int, ...]
    compute_ms: tuple[float, ...]
    comm_ms: tuple[float, ...]
    samples_per_s: float

    @classmethod
    def from_artifact(cls, phase: Mapping[str, Any]) -> MeasuredPhase:
        try:
            batches = tuple(int(b) for b in phase["local_batches"])
            compute = tuple(float(t) for t in phase["worker_compute_ms"])
            comm = tuple(float(t) for t in phase["worker_comm_ms"])
            samples_per_s = float(phase["samples_per_s"])
        except KeyError as exc:
            raise ValueError(f"phase.{exc.args[0]}: missing from the runtime benchmark result") from exc
        if not batches or not len(batches) == len(compute) == len(comm):
            raise ValueError("phase: one local batch, compute time and comm time per worker are needed")
        return cls(batches, compute, comm, samples_per_s)

    @property
    def global_batch(self) -> int:
        return sum(self.local_batches)


@dataclass(frozen=True, slots=True)
class BalancePrediction:
    predicted_split: tuple[int, ...]
    predicted_samples_per_s: float  # at the predicted split
    predicted_at_run_split_samples_per_s: float  # at the split the balanced phase used
    even_model_samples_per_s: float  # the model at the even split, against the even phase itself
    measured: MeasuredPhase
    even: MeasuredPhase

    @property
    def error(self) -> float:
        """Predicted samples/s of the predicted split over the balanced phase's measured, minus 1."""
        return self.predicted_samples_per_s / self.measured.samples_per_s - 1

    @property
    def error_at_run_split(self) -> float:
        """The same at the split the run used: the model's extrapolation alone, whatever split it chose."""
        return self.predicted_at_run_split_samples_per_s / self.measured.samples_per_s - 1

    @property
    def even_error(self) -> float:
        """The model against the phase it was learnt from: time it does not model at all."""
        return self.even_model_samples_per_s / self.even.samples_per_s - 1

    @property
    def split_difference(self) -> float:
        """Largest difference of one worker's share of the global batch, predicted against run."""
        total = self.measured.global_batch
        return max(
            abs(p - m) / total for p, m in zip(self.predicted_split, self.measured.local_batches, strict=True)
        )


def even_phase_model(even: MeasuredPhase) -> ClusterModel:
    """The rebalancer's model after one round at the even split: one sample per worker, synced when
    its compute ends."""
    per_worker = zip(even.local_batches, even.compute_ms, even.comm_ms, strict=True)
    history = {
        rank: [PerfSample(batch=b, compute_ms=c, sync_start_ms=c, comm_ms=comm)]
        for rank, (b, c, comm) in enumerate(per_worker)
    }
    workers = [WorkerSpec(name=f"rank{rank}") for rank in range(len(even.local_batches))]
    return speed_model(history, workers)


def samples_per_s(model: ClusterModel, split: Sequence[int]) -> float:
    return sum(split) * 1000.0 / predict_iteration_time(model, list(split))


def predict_balanced(even: MeasuredPhase, balanced: MeasuredPhase) -> BalancePrediction:
    """The balanced phase predicted from the even one, beside what the balanced phase measured."""
    if len(even.local_batches) != len(balanced.local_batches) or even.global_batch != balanced.global_batch:
        raise ValueError("phases: the even and balanced phases must have the same workers and global batch")
    model = even_phase_model(even)
    split = optimal_split(model, even.global_batch).local_batches
    return BalancePrediction(
        predicted_split=split,
        predicted_samples_per_s=samples_per_s(model, split),
        predicted_at_run_split_samples_per_s=samples_per_s(model, balanced.local_batches),
        even_model_samples_per_s=samples_per_s(model, even.local_batches),
        measured=balanced,
        even=even,
    )
