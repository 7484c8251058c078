"""Each rank's planned share of an IterableDataset, which has no index to split by.

Every rank reads the same stream in the same order and cuts it into global batches of B samples; of
each, rank i keeps its contiguous slice of b_i (a short last batch is split in the plan's proportions,
as for a map-style dataset). Every sample is thus used once per pass, by exactly one rank, and a
position (samples consumed) resumes by skipping that many. The price: each rank reads, and drops,
the other ranks' samples; a stream that shards itself at its source avoids that.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from hetero_runtime.sampler import rank_slices, split_tail


@dataclass(frozen=True)
class StreamStep:
    samples: list[Any]  # this rank's samples (one stand-in sample when its share is empty)
    sizes: list[int]  # every rank's count this step


def stream_steps(
    stream: Iterable[Any], consumed: int, local_batches: Sequence[int], rank: int
) -> Iterator[StreamStep]:
    """This rank's samples per step, from `consumed` samples into the stream to its end."""
    samples = islice(iter(stream), consumed, None)
    global_batch = sum(local_batches)
    while chunk := list(islice(samples, global_batch)):
        sizes = list(local_batches) if len(chunk) == global_batch else split_tail(local_batches, len(chunk))
        own = chunk[rank_slices(sizes, 0)[rank]]
        # A rank with no sample still runs the step (the all-reduce must meet every rank): on a
        # stand-in sample whose gradient counts zero.
        yield StreamStep(own or chunk[:1], sizes)
