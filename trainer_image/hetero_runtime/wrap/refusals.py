"""Pure checks of what a script of the user's own can run under; each returns the message to stop with."""

from __future__ import annotations

from typing import Any

from hetero_operator.plan import Plan, Strategy

SUPPORTED_STRATEGY = Strategy.DATA


def strategy_refusal(plan: Plan) -> str | None:
    """A script that keeps its own loop runs the synchronous `data` strategy only: the other strategies
    change what a step is (local steps, pipelines, per-layer updates) and need the runtime's loop."""
    if plan.strategy is SUPPORTED_STRATEGY:
        return None
    return (
        f"plan version {plan.version} runs strategy {plan.strategy.value!r}, but a training script of your "
        f"own (heterotrain worker -- CMD, or hetero_runtime.wrap) runs the {SUPPORTED_STRATEGY.value!r} "
        "strategy only: set spec.parallelism.strategy: data, or hand the loop to "
        "hetero_runtime.api.TrainingJob to use " + repr(plan.strategy.value)
    )


def dataset_refusal(dataset: Any) -> str | None:
    """The sampler splits a dataset by sample index: it needs __len__ and __getitem__."""
    kind = type(dataset).__name__
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        return (
            f"dataset: HeteroDataLoader splits each global batch by sample index, but a {kind} has no "
            "__len__/__getitem__ (an IterableDataset cannot be split that way): give a map-style dataset "
            "(e.g. torch.utils.data.TensorDataset, or a Dataset with __len__ and __getitem__)"
        )
    try:
        size = len(dataset)
    except TypeError as error:
        return f"dataset: len() of the {kind} failed ({error}): give a map-style dataset with a length"
    if size < 1:
        return f"dataset: the {kind} is empty: HeteroDataLoader needs at least one sample"
    return None
