"""Pure checks of what a script of the user's own can run under; each returns the message to stop with."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset

from hetero_operator.plan import Plan, Strategy

WRAPPED_STRATEGIES = (Strategy.DATA, Strategy.SESGD, Strategy.DREAMDDP, Strategy.ESYNC)
"""What a loop of the script's own can run: a synchronous step, or local steps then averaging."""


def strategy_refusal(plan: Plan) -> str | None:
    """`hetpipe` changes what a step is (a model cut into pipeline stages): it needs the runtime's
    loop."""
    if plan.strategy in WRAPPED_STRATEGIES:
        return None
    names = ", ".join(s.value for s in WRAPPED_STRATEGIES)
    return (
        f"plan version {plan.version} runs strategy {plan.strategy.value!r}, but a training script of your "
        f"own (hetero_runtime.wrap) runs {names} only: set spec.parallelism.strategy: data (or another of "
        "those), or hand the loop to hetero_runtime.api.TrainingJob to use " + repr(plan.strategy.value)
    )


def unmodified_script_refusal(plan: Plan) -> str | None:
    """`heterotrain worker -- CMD` runs a DDP script as it is: only the `data` strategy means what such a
    script does (every other strategy needs the wrapper, or the runtime's loop)."""
    if plan.strategy is Strategy.DATA:
        return None
    wrapped = plan.strategy in WRAPPED_STRATEGIES
    port = (
        "port the script to hetero_runtime.wrap (docs/porting.md) and start it without "
        "`heterotrain worker --` (command: [python, train.py])"
        if wrapped
        else "hand the loop to hetero_runtime.api.TrainingJob"
    )
    return (
        f"plan version {plan.version} runs strategy {plan.strategy.value!r}, but `heterotrain worker -- CMD` "
        "runs an unmodified DDP script, which synchronises every step as the 'data' strategy does: set "
        f"spec.parallelism.strategy: data, or {port} to use {plan.strategy.value!r}"
    )


def own_shuffle_refusal(plan: Plan, indexed: bool) -> str | None:
    """`esync` draws each rank's minibatches from the rank's own shuffle, so it needs indices."""
    if plan.strategy is not Strategy.ESYNC or indexed:
        return None
    return (
        f"plan version {plan.version} runs strategy 'esync', which draws each rank's minibatches from its "
        "own shuffle of an indexed dataset, but the loader reads a stream: give HeteroDataLoader a "
        "map-style dataset (__len__ and __getitem__), or set spec.parallelism.strategy: data"
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
