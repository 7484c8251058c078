"""`HeteroTrainJob.spec.parallelism`: the training strategy and its parameters.

Each strategy other than plain data parallelism has its own parameter block, allowed only when that
strategy is chosen.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import ConfigDict, Field, PositiveFloat, model_validator

from hetero_operator.plan import Strategy
from hetero_operator.resources.base import CelRule, WireModel, cel_rules


class AllocationPolicy(StrEnum):
    """How HetPipe groups GPUs into virtual workers."""

    NODE_PARTITION = "NP"
    EQUAL_DISTRIBUTION = "ED"
    HYBRID_DISTRIBUTION = "HD"
    AUTO = "auto"


# --- strategy parameters -----------------------------------------------------------------------


class HetPipeParameters(WireModel):
    """HetPipe: GPUs are grouped into virtual workers that each run a pipeline over the model's layers;
    virtual workers synchronise through parameter servers under Wave Synchronous Parallel."""

    virtual_worker_size: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="GPUs per virtual worker (pipeline stages). Unset: the planner picks the size whose "
        "virtual workers it predicts fastest.",
    )
    allocation_policy: AllocationPolicy = Field(
        default=AllocationPolicy.AUTO,
        description="Grouping of GPUs into virtual workers: NP (one node per virtual worker), ED (every node "
        "gives GPUs evenly to every virtual worker), HD (pairs of fast and slow node groups), or auto (the "
        "policy with the highest predicted throughput).",
    )
    pipeline_depth: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Minibatches in flight inside a virtual worker (Nm). Unset: the largest that fits in the "
        "memory of every virtual worker.",
    )
    staleness: int = Field(
        default=0,
        ge=0,
        le=64,
        description="Clock distance bound D between the fastest and the slowest virtual worker, in waves. "
        "0 makes the waves synchronous.",
    )
    layer_costs: list[PositiveFloat] | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="Relative compute cost of each layer of the model's `layers`, in order (for example its "
        "parameter counts): the first plan cuts each virtual worker's pipeline where its stages take equal "
        "time at their GPUs' speeds. Unset: the first plan cuts one layer per stage but the last. Either "
        "way the workers time every layer on their own devices at start, and with rebalancing on (and "
        "Prometheus) the operator re-cuts each pipeline from those measured costs.",
    )


class ESyncParameters(WireModel):
    """ESync: every round, each worker runs as many local SGD steps as fit in the time the slowest worker
    needs for one step, then all workers average their model deltas synchronously."""

    global_step_size: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="Global learning rate applied to the averaged model delta (the paper's epsilon).",
    )
    max_local_steps: int = Field(
        default=1000,
        ge=1,
        le=100_000,
        description="Upper bound on local steps per round on the fastest worker.",
    )
    round_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=86_400,
        description="A round that has not aggregated after this long is treated as a failed worker.",
    )


class DreamDDPParameters(WireModel):
    """DreamDDP: partial local SGD. Layers are averaged on a schedule of `period` steps chosen so their
    communication hides behind backpropagation (a layer's all-reduce starts once its backward pass has
    ended, and all-reduces share one link)."""

    period: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Synchronisation period H in steps: every layer is averaged once per period.",
    )


class SESGDParameters(WireModel):
    """SESGD: each step, workers average their models inside small groups that are redrawn every step
    from a shared seed."""

    groups: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Number of groups k. The worker count must be a multiple of it. Unset: about the square "
        "root of the worker count.",
    )
    seed: int = Field(
        default=0, ge=0, le=(1 << 32) - 1, description="Seed shared by all workers for redrawing the groups."
    )


def _only_with_strategy(strategy: Strategy) -> CelRule:
    name = strategy.value
    return CelRule(
        rule=f"!has(self.{name}) || self.strategy == '{name}'",
        message=f"parallelism.{name} is only allowed when parallelism.strategy is {name}: remove it or set "
        f"strategy: {name}",
        field_path=f".{name}",
        reason="FieldValueForbidden",
    )


STRATEGY_PARAMETER_RULES = {
    strategy: _only_with_strategy(strategy) for strategy in Strategy if strategy is not Strategy.DATA
}


class Parallelism(WireModel):
    """How the job is split across its workers. Only the parameter block of the chosen strategy may be set."""

    model_config = ConfigDict(json_schema_extra=cel_rules(*STRATEGY_PARAMETER_RULES.values()))

    strategy: Strategy = Field(
        default=Strategy.DATA,
        description="data (data parallel with batches sized to each GPU's speed), hetpipe, esync, dreamddp "
        "or sesgd.",
    )
    hetpipe: HetPipeParameters | None = Field(default=None, description="Parameters for strategy hetpipe.")
    esync: ESyncParameters | None = Field(default=None, description="Parameters for strategy esync.")
    dreamddp: DreamDDPParameters | None = Field(default=None, description="Parameters for strategy dreamddp.")
    sesgd: SESGDParameters | None = Field(default=None, description="Parameters for strategy sesgd.")

    @model_validator(mode="after")
    def _parameters_match_strategy(self) -> Self:
        for strategy, rule in STRATEGY_PARAMETER_RULES.items():
            if getattr(self, strategy.value) is not None and self.strategy is not strategy:
                raise rule.violation(f"strategy is {self.strategy.value}")
        return self

    def parameters(
        self,
    ) -> HetPipeParameters | ESyncParameters | DreamDDPParameters | SESGDParameters | None:
        """The chosen strategy's parameters, with defaults when the block was left out."""
        defaults = {
            Strategy.HETPIPE: HetPipeParameters,
            Strategy.ESYNC: ESyncParameters,
            Strategy.DREAMDDP: DreamDDPParameters,
            Strategy.SESGD: SESGDParameters,
        }
        if self.strategy is Strategy.DATA:
            return None
        given = getattr(self, self.strategy.value)
        return given if given is not None else defaults[self.strategy]()
