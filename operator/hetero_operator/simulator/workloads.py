"""Training workloads: how fast one GPU of each class trains a model, and how much memory it needs.

Per-GPU throughputs for K80, P100 and V100 are the isolated (one job per GPU) measurements published
with "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads" (Narayanan et al.,
OSDI 2020), reported there in iterations per second at a fixed batch size; they are multiplied by the
batch size here. A100 figures are not in that table: they assume 2.0x a V100, a conservative reading
of the training speedups over V100 that NVIDIA's A100 Tensor Core GPU architecture whitepaper
reports. Where no number is published for a class (the model does not fit, or was not measured),
the rate is estimated from the class's relative speed and the model's V100 rate, and marked so.

Each rate becomes the planner's per-GPU linear model (compute ``alpha*b + beta`` ms, ``beta`` a fixed
share of the step) packed as the scheduler's `MeasuredProfile`: the simulator plays a cluster whose
jobs have already been measured, which is what the operator sees after the first epoch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hetero_operator.scheduler import ClassProfile, GPUClassInfo, MeasuredProfile

# Share of one step that does not shrink with the local batch (kernel launches, optimizer step).
FIXED_SHARE = 0.1
# Share of the compute done when the first gradient bucket is ready for the all-reduce.
SYNC_SHARE = 0.5
# Share of the all-reduce that is the last bucket (it never overlaps the backward pass).
LAST_BUCKET_SHARE = 0.25
# A100 over V100 (see the module docstring).
A100_OVER_V100 = 2.0


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """One trainable model. ``samples_per_s`` maps GPU class to one GPU's throughput at local batch
    ``batch_per_gpu`` (published figures); ``memory_gib`` is what one data-parallel replica needs at
    that batch; ``allreduce_ms`` the gradient all-reduce time; ``checkpoint_s`` the time to save and
    restore a checkpoint when the job is preempted or resized."""

    name: str
    batch_per_gpu: int
    memory_gib: float
    samples_per_s: Mapping[str, float]
    allreduce_ms: float
    checkpoint_s: float
    estimated: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples_per_s", MappingProxyType(dict(self.samples_per_s)))

    def fits(self, gpu: GPUClassInfo) -> bool:
        """Whether one replica fits in one GPU of this class."""
        return self.memory_gib <= gpu.memory_gib

    def rate_on(self, gpu: GPUClassInfo) -> float:
        """Samples/s of one GPU of ``gpu``'s class: the published figure, else an estimate from the
        class's relative speed (V100 = 1.0 in the shipped clusters)."""
        if gpu.name in self.samples_per_s:
            return self.samples_per_s[gpu.name]
        return self.samples_per_s["v100"] * gpu.relative_speed

    def class_profile(self, gpu: GPUClassInfo) -> ClassProfile:
        step_ms = 1000.0 * self.batch_per_gpu / self.rate_on(gpu)
        alpha = (1.0 - FIXED_SHARE) * step_ms / self.batch_per_gpu
        beta = FIXED_SHARE * step_ms
        return ClassProfile(alpha, beta, SYNC_SHARE * alpha, SYNC_SHARE * beta)

    def measured_profile(self, classes: tuple[GPUClassInfo, ...]) -> MeasuredProfile:
        per_class = {gpu.name: self.class_profile(gpu) for gpu in classes}
        last = LAST_BUCKET_SHARE * self.allreduce_ms
        return MeasuredProfile.from_mapping(per_class, self.allreduce_ms - last, last)

    def local_batch_cap(self, gpu: GPUClassInfo) -> int:
        """Largest local batch one GPU of this class holds: activations scale with the batch."""
        return max(1, math.floor(self.batch_per_gpu * gpu.memory_gib / self.memory_gib))


def _per_gpu(iterations_per_s: Mapping[str, float], batch: int) -> dict[str, float]:
    return {name: rate * batch for name, rate in iterations_per_s.items()}


# Iterations/s from the Gavel paper's isolated-throughput table (K80, P100, V100), times batch size.
RESNET18 = ModelProfile(
    name="resnet18",
    batch_per_gpu=256,
    memory_gib=4.0,
    samples_per_s=_per_gpu(
        {"k80": 2.5097, "p100": 9.9416, "v100": 16.9874, "a100": 16.9874 * A100_OVER_V100}, 256
    ),
    allreduce_ms=25.0,  # 11.7M parameters
    checkpoint_s=20.0,
)
RESNET50 = ModelProfile(
    name="resnet50",
    batch_per_gpu=128,
    # Needs more than a 12 GiB K80 holds at batch 128: the published table has no K80 figure.
    memory_gib=14.0,
    samples_per_s=_per_gpu({"p100": 1.0824, "v100": 2.8460, "a100": 2.8460 * A100_OVER_V100}, 128),
    allreduce_ms=50.0,  # 25.6M parameters
    checkpoint_s=40.0,
    estimated=frozenset({"k80"}),
)
TRANSFORMER = ModelProfile(
    name="transformer",
    batch_per_gpu=64,
    memory_gib=6.0,
    samples_per_s=_per_gpu({"p100": 5.0724, "v100": 9.5680, "a100": 9.5680 * A100_OVER_V100}, 64),
    allreduce_ms=60.0,
    checkpoint_s=30.0,
    estimated=frozenset({"k80"}),
)

MODELS: Mapping[str, ModelProfile] = MappingProxyType({m.name: m for m in (RESNET18, RESNET50, TRANSFORMER)})


def model_named(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"model: unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
