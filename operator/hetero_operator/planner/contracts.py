"""The JSON contracts of `heterotrain plan KIND`: one request and one response model per kind.

Unknown fields are rejected, numbers must be finite, and cross-field rules raise messages that
start with the offending field's name.
"""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]
Name = Annotated[str, Field(min_length=1)]


class Contract(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


# ---- batch ---------------------------------------------------------------------------------------


class BatchWorker(Contract):
    name: Name
    q: NonNegative = Field(description="per-sample time of data loading + forward (ms)")
    s: NonNegative = Field(description="fixed time of data loading + forward + update (ms)")
    k: NonNegative = Field(description="per-sample backward time (ms)")
    m: NonNegative = Field(description="fixed backward time (ms)")
    min_batch: Annotated[int, Field(ge=0)] = 1
    max_batch: Annotated[int, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise ValueError(f"max_batch ({self.max_batch}) is below min_batch ({self.min_batch})")
        if self.q + self.k <= 0:
            raise ValueError("q + k must be positive: a worker's time has to grow with its batch")
        return self


class BatchRequest(Contract):
    global_batch: Annotated[int, Field(ge=1)]
    gamma: Annotated[float, Field(ge=0, le=1)]
    t_o: NonNegative
    t_u: NonNegative
    workers: Annotated[list[BatchWorker], Field(min_length=1)]

    @model_validator(mode="after")
    def _feasible(self) -> Self:
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            raise ValueError("workers: names must be unique")
        for i, w in enumerate(self.workers):
            if w.q + self.gamma * w.k <= 0:
                raise ValueError(f"workers.{i}.q: q + gamma*k must be positive (raise q or gamma)")
        low = sum(w.min_batch for w in self.workers)
        if self.global_batch < low:
            raise ValueError(
                f"global_batch: {self.global_batch} is below the sum of min_batch ({low}); "
                "raise global_batch or lower min_batch"
            )
        if all(w.max_batch is not None for w in self.workers):
            high = sum(w.max_batch or 0 for w in self.workers)
            if self.global_batch > high:
                raise ValueError(
                    f"global_batch: {self.global_batch} is above the sum of max_batch ({high}); "
                    "lower global_batch or raise max_batch"
                )
        return self


class BatchResponse(Contract):
    local_batches: list[int]
    iteration_time: float


# ---- pipeline ------------------------------------------------------------------------------------


class PipelineLayer(Contract):
    time: NonNegative = Field(description="compute time in ms at speed 1.0")
    activation_mb: NonNegative
    param_mb: NonNegative
    stash_mb: NonNegative


class PipelineGpu(Contract):
    name: Name
    speed: Positive
    memory_mb: Positive
    node: Name


class PipelineLink(Contract):
    latency_ms: NonNegative
    mb_per_ms: Positive


class PipelineLinks(Contract):
    same_node: PipelineLink
    cross_node: PipelineLink


class PipelineRequest(Contract):
    layers: Annotated[list[PipelineLayer], Field(min_length=1)]
    gpus: Annotated[list[PipelineGpu], Field(min_length=1)]
    nm: Annotated[int, Field(ge=1)]
    links: PipelineLinks
    fixed_order: bool = False

    @model_validator(mode="after")
    def _shape(self) -> Self:
        names = [g.name for g in self.gpus]
        if len(set(names)) != len(names):
            raise ValueError("gpus: names must be unique")
        if len(self.layers) < len(self.gpus):
            raise ValueError(
                f"layers: {len(self.layers)} layers cannot give each of {len(self.gpus)} GPUs "
                "a non-empty stage"
            )
        return self


class PipelineResponse(Contract):
    order: list[str]
    stages: list[list[int]]
    stage_ms: list[float]
    bottleneck_ms: float


# ---- dreamddp ------------------------------------------------------------------------------------


class DreamDdpRequest(Contract):
    H: Annotated[int, Field(ge=1, description="period: number of phases")]
    forward_ms: NonNegative
    backward_ms: Annotated[
        list[NonNegative], Field(min_length=1, description="backward order, 0 = output side")
    ]
    comm_ms: Annotated[list[NonNegative], Field(min_length=1)]

    @model_validator(mode="after")
    def _lengths(self) -> Self:
        if len(self.comm_ms) != len(self.backward_ms):
            raise ValueError(
                f"comm_ms: has {len(self.comm_ms)} entries but backward_ms has {len(self.backward_ms)}; "
                "give one per layer"
            )
        return self


class DreamDdpResponse(Contract):
    phases: list[list[int]]
    extra: list[list[int]]
    iteration_ms: list[float]
    period_ms: float
    exposed_ms: float


# ---- esync / sesgd -------------------------------------------------------------------------------


class EsyncRequest(Contract):
    step_ms: Annotated[list[Positive], Field(min_length=1)]
    epsilon_ms: NonNegative


class EsyncResponse(Contract):
    local_steps: list[int]


class SesgdRequest(Contract):
    n: Annotated[int, Field(ge=1)]
    k: Annotated[int, Field(ge=1)]
    seed: Annotated[int, Field(ge=0, lt=2**64)]
    steps: Annotated[int, Field(ge=0, le=1_000_000)]

    @model_validator(mode="after")
    def _divisible(self) -> Self:
        if self.n % self.k:
            raise ValueError(
                f"k: {self.n} workers cannot form {self.k} equal groups; n must be a multiple of k"
            )
        return self


class SesgdResponse(Contract):
    groups: list[list[list[int]]]


# ---- virtual workers -----------------------------------------------------------------------------


class VwNode(Contract):
    name: Name
    gpu_class: Name
    gpus: Annotated[int, Field(ge=1)]
    speed: Positive
    memory_gb: Positive


class VwRequest(Contract):
    nodes: Annotated[list[VwNode], Field(min_length=1)]
    k: Annotated[int, Field(ge=1)]
    policy: Literal["NP", "ED", "HD", "auto"]

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError("nodes: names must be unique")
        return self


class VwSlot(Contract):
    node: str
    gpu_index: int


class VwResponse(Contract):
    virtual_workers: list[list[VwSlot]]
    policy: str
