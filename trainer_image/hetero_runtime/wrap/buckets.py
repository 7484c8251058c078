"""The weighted all-reduce of `strategies/data.py`, Σ (b_i/B)·g_i, cut into buckets that start while
backward is still running, as DDP overlaps its own: a bucket leaves as soon as all of its gradients
are accumulated, and the buckets leave in one fixed order on every rank, so the collectives match.

The gradient noise scale needs |g_i|² of each rank and |g|² of the sum: on the steps that measure it,
the buckets add up the squares on their way and the last bucket carries the ranks' norms along.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

BUCKET_CAP_ELEMENTS = 2**20  # 4 MiB of float32 per bucket: early enough overlap, few collectives


def bucket_layout(sizes: Sequence[int], cap: int = BUCKET_CAP_ELEMENTS) -> list[list[int]]:
    """Parameter indices per bucket, last parameters first (backward produces their gradients first);
    a bucket holds at most `cap` elements unless one parameter alone is larger."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in reversed(range(len(sizes))):
        if current and filled + sizes[index] > cap:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True)
class Norms:
    local_sq: list[float]  # |g_i|² of every rank, before weighting
    global_sq: float  # |Σ (b_i/B)·g_i|²


class BucketedAllReduce:
    """One backward pass at a time: `begin`, then `ready` per accumulated gradient, then `finish`."""

    def __init__(
        self, params: Sequence[nn.Parameter], rank: int, world: int, cap: int = BUCKET_CAP_ELEMENTS
    ) -> None:
        self.params = list(params)
        self.rank = rank
        self.world = world
        self.layout = bucket_layout([p.numel() for p in self.params], cap)
        self.bucket_of = {index: b for b, members in enumerate(self.layout) for index in members}
        self._reset()

    def _reset(self) -> None:
        self.waiting = [len(members) for members in self.layout]
        self.next_bucket = 0
        self.in_flight: list[tuple[int, dist.Work | None, torch.Tensor]] = []
        self.weight = 0.0
        self.measure = False
        self.local_sq: torch.Tensor | None = None

    def begin(self, weight: float, measure: bool) -> None:
        self.weight = weight
        self.measure = measure

    def ready(self, index: int) -> None:
        """Parameter `index` has its gradient: send every bucket, in order, that is now complete."""
        self.waiting[self.bucket_of[index]] -= 1
        while self.next_bucket < len(self.layout) and self.waiting[self.next_bucket] == 0:
            self._send(self.next_bucket)

    def _send(self, bucket: int) -> None:
        members = [self.params[i] for i in self.layout[bucket]]
        buffer = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in members]
        )
        if self.weight == 0.0:
            # A stand-in batch: its gradient must not count, not even a non-finite one. An accumulated
            # gradient is the same on every rank, and the other ranks' weights sum to 1: it survives.
            buffer.zero_()
        else:
            if self.measure:
                square = buffer.dot(buffer)  # |g|² without a temporary the size of the bucket
                self.local_sq = square if self.local_sq is None else self.local_sq + square
            buffer.mul_(self.weight)
        if self.measure and bucket == len(self.layout) - 1:
            # Every rank's |g_i|² rides in the last bucket: no collective of its own.
            norms = torch.zeros(self.world, dtype=buffer.dtype, device=buffer.device)
            if self.local_sq is not None:
                norms[self.rank] = self.local_sq
            buffer = torch.cat([buffer, norms])
        work = dist.all_reduce(buffer, async_op=True) if self.world > 1 else None
        self.in_flight.append((bucket, work, buffer))
        self.next_bucket = bucket + 1

    def finish(self) -> Norms | None:
        """Send what unused parameters held back, wait for every bucket, write the sums into .grad;
        the norms on a measuring step."""
        while self.next_bucket < len(self.layout):
            self._send(self.next_bucket)
        global_sq = 0.0
        local_sq: list[float] = []
        for bucket, work, buffer in self.in_flight:
            if work is not None:
                work.wait()
            if self.measure and bucket == len(self.layout) - 1:
                local_sq = buffer[-self.world :].tolist()
                buffer = buffer[: -self.world]
            offset = 0
            for index in self.layout[bucket]:
                param = self.params[index]
                grad = buffer[offset : offset + param.numel()].view_as(param)
                if param.grad is None:
                    param.grad = grad.clone()
                else:
                    param.grad.copy_(grad)
                offset += param.numel()
            if self.measure:
                global_sq += float(buffer.dot(buffer))
        norms = Norms(local_sq, global_sq) if self.measure else None
        self._reset()
        return norms
