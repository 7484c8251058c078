"""Training workloads: how fast one GPU of each class trains a model, and how much memory it needs.

Every figure below names its source beside it; class names are canonical lowercase (k80, p100, v100,
t4, a100, rtx2080ti, rtx6000). Sources:

- [Gavel paper] "Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads"
  (Narayanan et al., OSDI 2020), isolated throughput table: iterations/s at a fixed batch size.
- [Gavel table] stanford-futuredata/gavel ``scheduler/simulation_throughputs.json`` (commit c4fa400),
  isolated one-GPU throughput in iterations/s.
- [Sia] siasosp23/artifacts ``sia-simulator/traces/<model>/placements-<cluster>.csv`` ("Sia:
  Heterogeneity-aware, goodput-optimized ML-cluster scheduling", SOSP 2023): one GPU, samples/s =
  local batch / step time; clusters aws (T4), azure (V100), dgx (A100-40GB), rtx (RTX 2080 Ti),
  quad (Quadro RTX 6000).

Where one model's figures come from two sources, the second source's figures are taken as ratios to
its own V100 figure and multiplied by the first source's V100 rate (the two were measured at
different batch sizes and data sets). Where no figure is published for a class (the model does not
fit, or was not measured), `ModelProfile.rate_on` estimates it from the class's relative speed and
the model's V100 rate; `estimated_classes` names those. Memory per replica and checkpoint and
all-reduce times are estimates from the models' parameter counts, not measurements.

The speed-up between two classes depends on the model (V100 over K80: 0.7x for Recommendation,
10x for ResNet-18 in Gavel's table; A100 over V100: 0.84x for YOLOv3, 2.8x for ResNet-18 in Sia's),
which is what a heterogeneity-aware scheduler exploits.

Each rate becomes the planner's per-GPU linear model (compute ``alpha*b + beta`` ms, ``beta`` a fixed
share of the step) packed as the scheduler's `MeasuredProfile`: a job's true speeds, which its
progress follows. What a policy sees of them is `knowledge`'s: by default only what the operator would
have measured by then.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from hetero_operator.scheduler import ClassProfile, GPUClassInfo, MeasuredProfile

# Share of one step that does not shrink with the local batch (kernel launches, optimizer step).
FIXED_SHARE = 0.1
# Share of the compute done when the first gradient bucket is ready for the all-reduce.
SYNC_SHARE = 0.5
# Share of the all-reduce that is the last bucket (it never overlaps the backward pass).
LAST_BUCKET_SHARE = 0.25
CANONICAL_CLASSES = ("k80", "p100", "v100", "t4", "a100", "rtx2080ti", "rtx6000")


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples_per_s", MappingProxyType(dict(self.samples_per_s)))

    def estimated_classes(self, classes: tuple[str, ...] = CANONICAL_CLASSES) -> tuple[str, ...]:
        """Classes whose rate is estimated from the class's relative speed (no published figure)."""
        return tuple(c for c in classes if c not in self.samples_per_s)

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


def _scaled(ratios_to_v100: Mapping[str, float], v100_rate: float) -> dict[str, float]:
    """Another source's figures, as ratios to its own V100 figure, on this model's V100 rate."""
    return {name: ratio * v100_rate for name, ratio in ratios_to_v100.items()}


def _sia_ratios(t4: float, v100: float, a100: float, rtx2080ti: float, rtx6000: float) -> dict[str, float]:
    return {"t4": t4 / v100, "a100": a100 / v100, "rtx2080ti": rtx2080ti / v100, "rtx6000": rtx6000 / v100}


# [Gavel paper] ResNet-18 (CIFAR-10) at batch 256: K80 2.5097, P100 9.9416, V100 16.9874 iterations/s.
_RESNET18_V100 = 16.9874 * 256
RESNET18 = ModelProfile(
    name="resnet18",
    batch_per_gpu=256,
    memory_gib=4.0,
    samples_per_s={
        **_per_gpu({"k80": 2.5097, "p100": 9.9416, "v100": 16.9874}, 256),
        # [Sia] ResNet-18 CIFAR-10 at local batch 129: T4 1242, V100 1174, A100 3332, 2080 Ti 1731,
        # RTX 6000 2111 samples/s.
        **_scaled(_sia_ratios(1242, 1174, 3332, 1731, 2111), _RESNET18_V100),
    },
    allreduce_ms=25.0,  # 11.7M parameters
    checkpoint_s=20.0,
)
# [Gavel paper] ResNet-50 (ImageNet) at batch 128: P100 1.0824, V100 2.8460 iterations/s. It needs more
# than a 12 GiB K80 holds at batch 128: the table has no K80 figure.
_RESNET50_V100 = 2.8460 * 128
RESNET50 = ModelProfile(
    name="resnet50",
    batch_per_gpu=128,
    memory_gib=14.0,
    samples_per_s={
        **_per_gpu({"p100": 1.0824, "v100": 2.8460}, 128),
        # [Sia] ResNet-50 ImageNet at local batch 115: T4 205, V100 464, A100 572, 2080 Ti 349,
        # RTX 6000 412 samples/s.
        **_scaled(_sia_ratios(205, 464, 572, 349, 412), _RESNET50_V100),
    },
    allreduce_ms=50.0,  # 25.6M parameters
    checkpoint_s=40.0,
)
# [Gavel paper] Transformer (translation) at batch 64: P100 5.0724, V100 9.5680 iterations/s;
# [Gavel table] K80 1.752 against V100 8.618 iterations/s at batch 64.
_TRANSFORMER_V100 = 9.5680 * 64
TRANSFORMER = ModelProfile(
    name="transformer",
    batch_per_gpu=64,
    memory_gib=6.0,
    samples_per_s={
        **_per_gpu({"p100": 5.0724, "v100": 9.5680}, 64),
        **_scaled({"k80": 1.752 / 8.618}, _TRANSFORMER_V100),
    },
    allreduce_ms=60.0,
    checkpoint_s=30.0,
)
# [Gavel table] LM (Wikitext-2 LSTM) at batch 20: K80 17.142, P100 58.173, V100 64.742 iterations/s.
LANGUAGE_MODEL = ModelProfile(
    name="lm",
    batch_per_gpu=20,
    memory_gib=4.0,
    samples_per_s=_per_gpu({"k80": 17.142, "p100": 58.173, "v100": 64.742}, 20),
    allreduce_ms=40.0,
    checkpoint_s=20.0,
)
# [Gavel table] Recommendation (autoencoder, ML-20M) at batch 2048: K80 10.441, P100 16.597, V100 7.470
# iterations/s: slower on a V100 than on a K80.
RECOMMENDATION = ModelProfile(
    name="recommendation",
    batch_per_gpu=2048,
    memory_gib=4.0,
    samples_per_s=_per_gpu({"k80": 10.441, "p100": 16.597, "v100": 7.470}, 2048),
    allreduce_ms=30.0,
    checkpoint_s=20.0,
)
# [Gavel table] CycleGAN (monet2photo) at batch 1: K80 0.505, P100 2.403, V100 4.426 iterations/s.
CYCLEGAN = ModelProfile(
    name="cyclegan",
    batch_per_gpu=1,
    memory_gib=4.0,
    samples_per_s=_per_gpu({"k80": 0.505, "p100": 2.403, "v100": 4.426}, 1),
    allreduce_ms=30.0,
    checkpoint_s=20.0,
)
# [Sia] BERT (SQuAD fine-tuning) at local batch 12: T4 13, V100 33, A100 67, 2080 Ti 27, RTX 6000 30
# samples/s.
BERT = ModelProfile(
    name="bert",
    batch_per_gpu=12,
    memory_gib=10.0,
    samples_per_s={"t4": 13.0, "v100": 33.0, "a100": 67.0, "rtx2080ti": 27.0, "rtx6000": 30.0},
    allreduce_ms=120.0,  # 110M parameters
    checkpoint_s=40.0,
)
# [Sia] YOLOv3 (PASCAL VOC) at local batch 8: T4 25, V100 32, A100 27, 2080 Ti 14, RTX 6000 35 samples/s.
YOLOV3 = ModelProfile(
    name="yolov3",
    batch_per_gpu=8,
    memory_gib=10.0,
    samples_per_s={"t4": 25.0, "v100": 32.0, "a100": 27.0, "rtx2080ti": 14.0, "rtx6000": 35.0},
    allreduce_ms=70.0,  # 62M parameters
    checkpoint_s=30.0,
)

MODELS: Mapping[str, ModelProfile] = MappingProxyType(
    {
        m.name: m
        for m in (RESNET18, RESNET50, TRANSFORMER, LANGUAGE_MODEL, RECOMMENDATION, CYCLEGAN, BERT, YOLOV3)
    }
)


def model_named(name: str) -> ModelProfile:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"model: unknown model {name!r}; known: {', '.join(sorted(MODELS))}") from None
