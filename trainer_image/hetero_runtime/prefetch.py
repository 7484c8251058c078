"""Batches copied to the GPU one step ahead, on a stream of their own: the copy of the next batch runs
on the copy engine while this step computes, instead of before it. On the CPU nothing changes.

The host side of the next batch (collation, and pinning where the loader has not pinned it) still
runs on the calling thread; a DataLoader with worker processes and `pin_memory=True` does both
elsewhere, so that only the copy is left, and the copy is what this hides."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from hetero_runtime.device import map_tensors

Item = TypeVar("Item")
Moved = TypeVar("Moved")

_END: Any = object()


def staged(items: Iterable[Item], move: Callable[[Item], Moved], device: torch.device) -> Iterator[Moved]:
    """`move(item)` for each item, in order. On a GPU, item k+1 is moved (on a side stream) before
    item k is handed out, and the caller's stream waits for each copy before using what it gave."""
    if device.type != "cuda":
        yield from (move(item) for item in items)
        return
    side = torch.cuda.Stream(device)
    upcoming = iter(items)

    def issue() -> Any:
        item = next(upcoming, _END)
        if item is _END:
            return _END
        with torch.cuda.stream(side):
            return move(item)

    compute = torch.cuda.current_stream(device)

    def used_by_compute(tensor: torch.Tensor) -> None:
        # Made on the side stream, used on the compute stream: its memory is not reused until the
        # compute stream is done with it.
        if tensor.is_cuda:
            tensor.record_stream(compute)

    pending = issue()
    while pending is not _END:
        compute.wait_stream(side)
        map_tensors(pending, used_by_compute)
        ready, pending = pending, issue()
        yield ready
