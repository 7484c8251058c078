"""Pure checks of the dataset a script of the user's own hands over; each returns the message to stop
with (the plan's checks are in `hetero_runtime.plan_refusals`)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset


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
