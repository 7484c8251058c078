"""Split every global batch over the ranks by the plan, with no overlap and no lost sample.

The order of an epoch depends only on (seed, epoch), never on the world size or the split, so a
position (epoch, samples already consumed) stays meaningful when a job resumes on another world size
or under another plan.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import numpy as np


@dataclass(frozen=True)
class SamplerPosition:
    epoch: int
    consumed: int  # samples of this epoch already trained on, over all ranks


def epoch_order(dataset_size: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of range(dataset_size) shared by every rank."""
    return np.random.default_rng([seed, epoch]).permutation(dataset_size)


def split_tail(local_batches: Sequence[int], tail: int) -> list[int]:
    """Split a short last batch of `tail` samples in the plan's proportions (largest remainder)."""
    total = sum(local_batches)
    exact = [b * tail / total for b in local_batches]
    sizes = [int(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (sizes[i] - exact[i], i))
    for i in order[: tail - sum(sizes)]:
        sizes[i] += 1
    return sizes


def step_sizes(dataset_size: int, consumed: int, local_batches: Sequence[int]) -> Iterator[list[int]]:
    """Per step, every rank's batch size, from `consumed` to the end of the epoch (no sample dropped)."""
    global_batch = sum(local_batches)
    remaining = dataset_size - consumed
    while remaining > 0:
        sizes = list(local_batches) if remaining >= global_batch else split_tail(local_batches, remaining)
        remaining -= sum(sizes)
        yield sizes


def rank_slices(sizes: Sequence[int], start: int) -> list[slice]:
    """Contiguous, disjoint slices of the global batch that starts at `start`, one per rank."""
    offsets = np.concatenate([[0], np.cumsum(sizes)]) + start
    return [slice(int(a), int(b)) for a, b in pairwise(offsets)]


@dataclass(frozen=True)
class LocalStep:
    indices: np.ndarray  # this rank's sample indices
    sizes: list[int]  # every rank's batch size in this step
    position_after: SamplerPosition


class UnevenBatchSampler:
    """Yields this rank's indices for each global step of one epoch, resuming from a position."""

    def __init__(self, dataset_size: int, rank: int, seed: int) -> None:
        if dataset_size < 1:
            raise ValueError("dataset is empty: the sampler needs at least one sample")
        self.dataset_size = dataset_size
        self.rank = rank
        self.seed = seed

    def epoch(self, position: SamplerPosition, local_batches: Sequence[int]) -> Iterator[LocalStep]:
        order = epoch_order(self.dataset_size, self.seed, position.epoch)
        consumed = position.consumed
        for sizes in step_sizes(self.dataset_size, consumed, local_batches):
            own = rank_slices(sizes, consumed)[self.rank]
            consumed += sum(sizes)
            yield LocalStep(order[own], sizes, SamplerPosition(position.epoch, consumed))

    def steps_in_epoch(self, position: SamplerPosition, local_batches: Sequence[int]) -> int:
        return sum(1 for _ in step_sizes(self.dataset_size, position.consumed, local_batches))
