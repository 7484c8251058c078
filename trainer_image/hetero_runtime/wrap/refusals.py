"""Pure checks of what a script of the user's own can run under; each returns the message to stop with."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

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


def is_stream(dataset: Any) -> bool:
    """An iterable-style dataset: it can be read in order, not indexed."""
    return isinstance(dataset, IterableDataset) or (
        hasattr(dataset, "__iter__") and not hasattr(dataset, "__getitem__")
    )


def dataset_refusal(dataset: Any, num_workers: int = 0) -> str | None:
    """A map-style dataset is split by sample index, so it needs __getitem__ and __len__; a stream is
    split by position, so every rank must read all of it in one process."""
    kind = type(dataset).__name__
    if is_stream(dataset):
        if num_workers > 0:
            return (
                f"dataset: a {kind} is an iterable (stream) dataset, and with num_workers={num_workers} each "
                "DataLoader worker process would read the whole stream again: pass num_workers=0, or give "
                "a map-style dataset (__len__ and __getitem__) to load in worker processes"
            )
        return None
    if not hasattr(dataset, "__getitem__"):
        return (
            f"dataset: HeteroDataLoader cannot read a {kind}: it has neither __getitem__ and __len__ (a "
            "map-style dataset, split by index) nor __iter__ (an IterableDataset, split by position): "
            "give one of those, e.g. torch.utils.data.TensorDataset"
        )
    if not hasattr(dataset, "__len__"):
        return (
            f"dataset: the {kind} has __getitem__ but no __len__, so HeteroDataLoader cannot tell which "
            "indices an epoch holds: add __len__, or make it a torch.utils.data.IterableDataset"
        )
    try:
        size = len(dataset)
    except TypeError as error:
        return f"dataset: len() of the {kind} failed ({error}): give a map-style dataset with a length"
    if size < 1:
        return f"dataset: the {kind} is empty: HeteroDataLoader needs at least one sample"
    return None
