"""The weighted all-reduce of `strategies/data.py`, Σ (b_i/B)·g_i, cut into buckets that start while
backward is still running, as DDP overlaps its own: a bucket leaves as soon as all of its gradients
are accumulated, and the buckets leave in one fixed order on every rank, so the collectives match.

Each bucket is one flat buffer kept for the whole run, and after the first step every gradient is a
view of its bucket (DDP's `gradient_as_bucket_view`): the reduced sums are the gradients, with no copy
back and no buffer allocated per step. Where the script sets the gradients to None between steps,
autograd makes new ones, and each is copied into its bucket once.

The gradient noise scale needs |g_i|² of each rank and |g|² of the sum: on the steps that measure it,
the buckets add up the squares on their way and the last bucket carries the ranks' norms along. The
last bucket also carries `riders`: values summed over the ranks with no collective of their own (the
runtime's weighted loss and its stop vote).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import reduce

import torch
import torch.distributed as dist
from torch import nn

# DDP's defaults: a small first bucket, so that the first collective leaves early in backward, then
# large ones, so that there are few collectives (each costs a launch and a round trip).
FIRST_BUCKET_CAP_ELEMENTS = 2**18  # 1 MiB of float32
BUCKET_CAP_ELEMENTS = 25 * 2**18  # 25 MiB of float32


def bucket_layout(
    sizes: Sequence[int], cap: int = BUCKET_CAP_ELEMENTS, first_cap: int | None = None
) -> list[list[int]]:
    """Parameter indices per bucket, last parameters first (backward produces their gradients first);
    the first bucket holds at most `first_cap` elements (`cap` if not given), the others `cap`, unless
    one parameter alone is larger."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    limit = cap if first_cap is None else first_cap
    for index in reversed(range(len(sizes))):
        if current and filled + sizes[index] > limit:
            buckets.append(current)
            current, filled, limit = [], 0, cap
        current.append(index)
        filled += sizes[index]
    if current:
        buckets.append(current)
    return buckets


@dataclass(frozen=True)
class Norms:
    local_sq: list[float]  # |g_i|² of every rank, before weighting
    global_sq: float  # |Σ (b_i/B)·g_i|²


@dataclass(frozen=True)
class Reduced:
    """What one synchronised pass brought back besides the gradients."""

    norms: Norms | None  # on a measuring pass
    riders: list[float] = field(default_factory=list)  # each rider's sum over the ranks


@dataclass(frozen=True)
class Bucket:
    members: list[int]  # parameter indices, in the layout's order
    buffer: torch.Tensor  # the members' gradients end to end, then (last bucket only) a slot per rank
    # and one per rider
    payload: torch.Tensor  # the gradients' part of `buffer`
    views: list[torch.Tensor]  # per member: its part of `payload`, shaped like the parameter


def build_bucket(members: list[nn.Parameter], indices: list[int], extra: int) -> Bucket:
    """One flat buffer for `members` (the widest of their dtypes) with `extra` slots at its end."""
    dtype = reduce(torch.promote_types, (p.dtype for p in members))
    total = sum(p.numel() for p in members)
    buffer = torch.zeros(total + extra, dtype=dtype, device=members[0].device)
    payload = buffer[:total]
    views, offset = [], 0
    for param in members:
        views.append(payload[offset : offset + param.numel()].view_as(param))
        offset += param.numel()
    return Bucket(indices, buffer, payload, views)


class BucketedAllReduce:
    """One backward pass at a time: `begin`, then `ready` per accumulated gradient, then `finish`."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        rank: int,
        world: int,
        cap: int = BUCKET_CAP_ELEMENTS,
        first_cap: int = FIRST_BUCKET_CAP_ELEMENTS,
        riders: int = 0,
    ) -> None:
        self.params = list(params)
        self.rank = rank
        self.world = world
        self.rider_count = riders
        layout = bucket_layout([p.numel() for p in self.params], cap, min(cap, first_cap))
        last = len(layout) - 1
        self.buckets = [
            build_bucket([self.params[i] for i in members], members, world + riders if number == last else 0)
            for number, members in enumerate(layout)
        ]
        self.bucket_of = {index: b for b, bucket in enumerate(self.buckets) for index in bucket.members}
        self._reset()

    @property
    def layout(self) -> list[list[int]]:
        return [bucket.members for bucket in self.buckets]

    def _reset(self) -> None:
        self.waiting = [len(bucket.members) for bucket in self.buckets]
        self.next_bucket = 0
        self.in_flight: list[tuple[Bucket, dist.Work | None]] = []
        self.weight = 0.0
        self.measure = False
        self.riders: Sequence[float | torch.Tensor] = ()
        self.local_sq: torch.Tensor | None = None

    def begin(self, weight: float, measure: bool, riders: Sequence[float | torch.Tensor] = ()) -> None:
        """A pass whose gradients count `weight`; `riders` (a number each, or a one-element tensor,
        which costs no wait for the device) are summed over the ranks with the last bucket."""
        if len(riders) != self.rider_count:
            raise ValueError(f"begin(riders=...): {len(riders)} values for {self.rider_count} rider slots")
        self.weight = weight
        self.measure = measure
        self.riders = riders

    def zero_gradients(self) -> None:
        """Zero every gradient for the next pass: in place where it is a view of its bucket (no new
        memory), set to None where it is not."""
        for bucket in self.buckets:
            bucket.payload.zero_()
            for index, view in zip(bucket.members, bucket.views, strict=True):
                grad = self.params[index].grad
                if grad is not None and not _is_view(grad, view):
                    self.params[index].grad = None

    def ready(self, index: int) -> None:
        """Parameter `index` has its gradient: send every bucket, in order, that is now complete."""
        self.waiting[self.bucket_of[index]] -= 1
        while self.next_bucket < len(self.buckets) and self.waiting[self.next_bucket] == 0:
            self._send(self.next_bucket)

    def _send(self, number: int) -> None:
        bucket = self.buckets[number]
        payload, weight = bucket.payload, self.weight
        if weight == 0.0:
            # A stand-in batch: its gradient must not count, not even a non-finite one. An accumulated
            # gradient is the same on every rank, and the other ranks' weights sum to 1: it survives.
            payload.zero_()
        else:
            for index, view in zip(bucket.members, bucket.views, strict=True):
                grad = self.params[index].grad
                if grad is None:
                    view.zero_()  # unused in this pass: it adds nothing
                elif _is_view(grad, view):
                    if weight != 1.0:  # (1.0: weighed already, as each accumulated pass arrived)
                        view.mul_(weight)
                else:
                    torch.mul(grad, weight, out=view)  # weighed on the way in: one pass, as DDP divides
            if self.measure:
                # |g|² of the unweighted gradient, without a temporary the size of the bucket.
                square = payload.dot(payload) / (weight * weight)
                self.local_sq = square if self.local_sq is None else self.local_sq + square
        if number == len(self.buckets) - 1:
            # Every rank's |g_i|² and the riders ride in the last bucket: no collective of their own.
            extras = bucket.buffer[payload.numel() :]
            extras.zero_()
            if self.measure and self.local_sq is not None:
                extras[self.rank] = self.local_sq
            for slot, value in enumerate(self.riders, start=self.world):
                extras[slot] = value
        work = dist.all_reduce(bucket.buffer, async_op=True) if self.world > 1 else None
        self.in_flight.append((bucket, work))
        self.next_bucket = number + 1

    def finish(self) -> Reduced:
        """Send what unused parameters held back, wait for every bucket; the sums are the gradients
        from now on (each .grad a view of its bucket); the norms on a measuring step, and the riders."""
        while self.next_bucket < len(self.buckets):
            self._send(self.next_bucket)
        global_sq = 0.0
        extras: list[float] = []
        for bucket, work in self.in_flight:
            if work is not None:
                work.wait()
            if bucket is self.buckets[-1] and (self.measure or self.rider_count):
                extras = bucket.buffer[bucket.payload.numel() :].tolist()  # (reading waits for the device)
            if self.measure:
                global_sq += float(bucket.payload.dot(bucket.payload))
            for index, view in zip(bucket.members, bucket.views, strict=True):
                param = self.params[index]
                if param.grad is None or not _is_view(param.grad, view):
                    if view.dtype == param.dtype:
                        param.grad = view
                    else:
                        param.grad = view.to(param.dtype)
        norms = Norms(extras[: self.world], global_sq) if self.measure else None
        self._reset()
        return Reduced(norms, extras[self.world :])


def _is_view(grad: torch.Tensor, view: torch.Tensor) -> bool:
    """`grad` is `view` itself (the same memory and shape): nothing to copy either way."""
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape and grad.dtype == view.dtype
