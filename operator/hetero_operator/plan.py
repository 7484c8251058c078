"""The training plan: the one document the operator writes and every worker reads.

The operator stores it as JSON under the key ``plan.json`` of the job's plan ConfigMap; the runtime
reads it at every epoch boundary. A plan says which strategy runs, how the global batch is split over
the ranks, and the strategy's own parameters. Everything here is pure pydantic: no torch, no kopf.
"""

from __future__ import annotations

from enum import StrEnum
from itertools import pairwise
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

PLAN_CONFIGMAP_KEY = "plan.json"
"""Key of the plan document inside the plan ConfigMap (and the file name of a file plan)."""

PLAN_SOURCE_ENV = "HETEROTRAIN_PLAN_SOURCE"
"""Environment variable that tells a worker where its plan lives.

Accepted forms: a file path or ``file://`` URL, ``configmap://NAMESPACE/NAME`` (read through the
Kubernetes API), or an ``http://``/``https://`` URL that returns the plan JSON.
"""


class Strategy(StrEnum):
    """How the workers cooperate; each value names one runtime strategy."""

    DATA = "data"
    HETPIPE = "hetpipe"
    ESYNC = "esync"
    DREAMDDP = "dreamddp"
    SESGD = "sesgd"


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HetPipeParams(_Frozen):
    """Virtual workers (pipelines of ranks) plus the pipeline and staleness knobs of WSP."""

    virtual_workers: list[list[NonNegativeInt]] = Field(
        description="Ranks of each virtual worker in stage order (first stage first)."
    )
    stage_boundaries: list[list[NonNegativeInt]] = Field(
        description=(
            "Per virtual worker, the index of the first layer of every stage after the first "
            "(len = stages - 1, strictly increasing)."
        )
    )
    microbatches_in_flight: PositiveInt = Field(
        default=1, description="Nm: minibatches in flight per pipeline."
    )
    staleness_bound: NonNegativeInt = Field(default=0, description="D: the WSP clock-distance bound.")

    @model_validator(mode="after")
    def _shapes_agree(self) -> Self:
        if len(self.stage_boundaries) != len(self.virtual_workers):
            raise ValueError(
                "hetpipe.stage_boundaries must have one entry per virtual worker "
                f"({len(self.virtual_workers)}), got {len(self.stage_boundaries)}"
            )
        for index, (ranks, cuts) in enumerate(zip(self.virtual_workers, self.stage_boundaries, strict=True)):
            if not ranks:
                raise ValueError(f"hetpipe.virtual_workers[{index}] is empty: give it at least one rank")
            if len(cuts) != len(ranks) - 1:
                raise ValueError(
                    f"hetpipe.stage_boundaries[{index}] needs {len(ranks) - 1} cut points for "
                    f"{len(ranks)} stages, got {len(cuts)}"
                )
            if any(b <= a for a, b in pairwise(cuts)) or (cuts and cuts[0] == 0):
                raise ValueError(
                    f"hetpipe.stage_boundaries[{index}] = {cuts} must increase strictly and start above 0"
                )
        return self


class ESyncParams(_Frozen):
    """Knobs of the ESync state query service and the delta averaging."""

    margin_seconds: Annotated[float, Field(ge=0.0)] = Field(
        default=0.001, description="ε: a worker stops when one more step would not end ε before the slowest."
    )
    global_learning_rate: PositiveFloat = Field(default=1.0, description="ϵ: w ← w + ϵ·mean(Δw).")
    max_local_steps: PositiveInt = Field(
        default=1000, description="Most local steps a worker takes in one round, whatever the service says."
    )
    round_timeout_seconds: PositiveFloat = Field(
        default=300.0,
        description="A round whose deltas are not averaged this long after it began has lost a worker: the "
        "worker stops with an error, and the job restarts from its checkpoint.",
    )
    state_service_port: Annotated[int, Field(ge=0, le=65535)] = Field(
        default=0,
        description="TCP port of the state query service on rank 0 (0 = a free port rank 0's "
        "system chooses, told to the other ranks).",
    )


class DreamDDPParams(_Frozen):
    """Partial-synchronisation period and, optionally, a precomputed phase schedule."""

    period: PositiveInt = Field(description="H: every layer is averaged at least once every H steps.")
    layer_phases: list[list[NonNegativeInt]] | None = Field(
        default=None,
        description=(
            "Per layer in backward order (output side first), the phases (0..H-1) in which it is averaged. "
            "None: the runtime profiles the layers and asks the planner."
        ),
    )

    @model_validator(mode="after")
    def _phases_in_period(self) -> Self:
        for layer, phases in enumerate(self.layer_phases or []):
            if not phases:
                raise ValueError(f"dreamddp.layer_phases[{layer}] is empty: every layer needs a phase")
            if any(p >= self.period for p in phases):
                raise ValueError(
                    f"dreamddp.layer_phases[{layer}] = {phases} has a phase >= period {self.period}"
                )
        return self


class SESGDParams(_Frozen):
    """Shuffled in-group parameter averaging."""

    groups: PositiveInt = Field(
        description="k: number of equal groups the ranks are shuffled into each step."
    )
    seed: NonNegativeInt = Field(default=0, description="ς: shared seed of the group shuffle.")


class Plan(_Frozen):
    """A versioned training plan. Validation only checks the plan on its own; see `fits_world`."""

    version: NonNegativeInt = Field(description="Monotonic plan version; a worker ignores older versions.")
    apply_at_epoch: NonNegativeInt = Field(default=0, description="First epoch that runs with this plan.")
    strategy: Strategy = Strategy.DATA
    world_size: PositiveInt
    global_batch: PositiveInt = Field(description="B: samples per global step, summed over ranks.")
    local_batches: list[NonNegativeInt] = Field(description="b_i per rank; sums to global_batch.")
    learning_rate_scale: PositiveFloat = Field(
        default=1.0, description="Factor applied to the base learning rate."
    )
    predicted_iteration_seconds: PositiveFloat | None = Field(
        default=None,
        description="The planner's predicted time of one global step, for comparison with measurement.",
    )
    hetpipe: HetPipeParams | None = None
    esync: ESyncParams | None = None
    dreamddp: DreamDDPParams | None = None
    sesgd: SESGDParams | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if len(self.local_batches) != self.world_size:
            raise ValueError(
                f"local_batches has {len(self.local_batches)} entries but world_size is {self.world_size}: "
                "give one local batch per rank"
            )
        if sum(self.local_batches) != self.global_batch:
            raise ValueError(
                f"local_batches sum to {sum(self.local_batches)} but global_batch is {self.global_batch}: "
                "make them add up"
            )
        if self.strategy != Strategy.HETPIPE and not any(self.local_batches):
            raise ValueError("local_batches are all zero: at least one rank must train")
        required = {
            Strategy.HETPIPE: self.hetpipe,
            Strategy.DREAMDDP: self.dreamddp,
            Strategy.SESGD: self.sesgd,
        }
        if self.strategy in required and required[self.strategy] is None:
            raise ValueError(
                f"strategy {self.strategy.value!r} needs its parameters under '{self.strategy.value}'"
            )
        if self.strategy in (Strategy.ESYNC, Strategy.SESGD, Strategy.DREAMDDP) and 0 in self.local_batches:
            raise ValueError(f"strategy {self.strategy.value!r} needs every local batch >= 1")
        if self.sesgd is not None and self.world_size % self.sesgd.groups != 0:
            raise ValueError(
                f"sesgd.groups = {self.sesgd.groups} does not divide world_size {self.world_size}: "
                "groups must be equal-sized"
            )
        if self.hetpipe is not None:
            ranks = sorted(r for vw in self.hetpipe.virtual_workers for r in vw)
            if ranks != list(range(self.world_size)):
                raise ValueError(
                    f"hetpipe.virtual_workers cover ranks {ranks}; "
                    f"they must use every rank 0..{self.world_size - 1} once"
                )
        return self

    def fits_world(self, world_size: int) -> str | None:
        """None if this plan can run on `world_size` ranks, else the reason it cannot."""
        if self.world_size != world_size:
            return f"plan is for world_size {self.world_size} but the job runs {world_size} ranks"
        return None

    def to_json(self) -> str:
        """The ConfigMap value for `PLAN_CONFIGMAP_KEY`."""
        return self.model_dump_json(indent=2, exclude_none=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Parse and validate; raises pydantic.ValidationError naming the bad field."""
        return cls.model_validate_json(text)


def even_local_batches(global_batch: int, world_size: int) -> list[int]:
    """Split `global_batch` as evenly as possible (the first ranks take the remainder)."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    base, extra = divmod(global_batch, world_size)
    return [base + (1 if rank < extra else 0) for rank in range(world_size)]


# The worker environment contract: set by the operator's pod builder and by `heterotrain run-local`,
# read by the runtime's launcher.
RANK_ENV = "RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
MASTER_ADDR_ENV = "MASTER_ADDR"
MASTER_PORT_ENV = "MASTER_PORT"
CHECKPOINT_DIR_ENV = "HETEROTRAIN_CHECKPOINT_DIR"
CHECKPOINT_EVERY_ENV = "HETEROTRAIN_CHECKPOINT_EVERY_EPOCHS"
# "1": the checkpoint directory is mounted on rank 0 only (ReadWriteOnce storage). Rank 0 writes and,
# on a resume, reads the newest checkpoint and sends it to the other ranks; they never touch the path.
CHECKPOINT_RANK0_ONLY_ENV = "HETEROTRAIN_CHECKPOINT_RANK0_ONLY"
SIMULATED_SPEED_ENV = "HETEROTRAIN_SIMULATED_SPEED"
# A file holding the simulated speed, re-read while the worker runs (the test bed's slowed nodes).
SIMULATED_SPEED_FILE_ENV = "HETEROTRAIN_SIMULATED_SPEED_FILE"
EPOCHS_ENV = "HETEROTRAIN_EPOCHS"
SEED_ENV = "HETEROTRAIN_SEED"
RESULT_FILE_ENV = "HETEROTRAIN_RESULT_FILE"
LOCAL_RANK_ENV = "LOCAL_RANK"
"""Index of the worker's GPU among those visible to it (0 in a pod, which sees only its own GPUs)."""
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
"""Workers on the worker's host, as torchrun sets it: 1 in a pod, which holds one worker (`run-local`
puts them all on one host)."""
PRECISION_ENV = "HETEROTRAIN_PRECISION"
"""The job's spec.precision (a `Precision` value); each worker resolves `auto` from its own device."""
CHECK_EVERY_STEPS_ENV = "HETEROTRAIN_CHECK_EVERY_STEPS"
"""How often (in steps) the ranks compare their parameters and check them for non-finite values; 0: at
epoch ends only. Set it in spec.env."""
DIVERGED_EXIT_CODE = 86
"""A worker's exit status when its job's ranks diverged or its numbers became non-finite: every rank
ends with it, and the operator fails the job without restarting it into the same failure."""
TERMINATION_LOG_ENV = "HETEROTRAIN_TERMINATION_LOG"
"""Where a worker writes its termination message, when not at the container's /dev/termination-log
(the test bed's local process nodes set it)."""
POD_ANNOTATIONS_FILE_ENV = "HETEROTRAIN_POD_ANNOTATIONS_FILE"
"""Path of the pod's annotations as the Downward API projects them (one `key="value"` per line)."""
CHECKPOINT_REQUESTED_ANNOTATION = "heterotrain.io/checkpoint-requested"
"""Set on worker pods (an ISO-8601 time) when they should save a checkpoint and stop: the operator is
about to delete them (preemption, shrink, suspend)."""


class Precision(StrEnum):
    """Arithmetic of the workers' forward and backward passes."""

    AUTO = "auto"  # bf16 where the GPU supports it, fp16 with loss scaling elsewhere, fp32 on CPUs
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


PROGRESS_PREFIX = "HETEROTRAIN_PROGRESS "
"""Rank 0 prints one line per finished epoch: this prefix, then a JSON object (epoch, plan_version,
steps, wall_seconds, evaluation, ...). Supervisors read it from the worker's output."""
