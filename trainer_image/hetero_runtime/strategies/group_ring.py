"""Ring all-reduce inside an ad-hoc group of ranks, over point-to-point ops on the world group, and
the sample-weighted group mean SESGD averages its replicas with.

No process group is created per group: with groups reshuffled every step there would be one per
possible group. Each chunk is reduced along the ring and then passed on unchanged, so every member
ends with bit-identical sums.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist


def _exchange(send: torch.Tensor, to_rank: int, recv: torch.Tensor, from_rank: int) -> None:
    ops = [dist.P2POp(dist.isend, send, to_rank), dist.P2POp(dist.irecv, recv, from_rank)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def group_ring_sum(buffer: torch.Tensor, members: Sequence[int], rank: int) -> None:
    """In place: `buffer` becomes the sum of the members' buffers (reduce-scatter, then all-gather)."""
    size = len(members)
    if size == 1:
        return
    position = members.index(rank)
    send_to, receive_from = members[(position + 1) % size], members[(position - 1) % size]
    chunks = list(buffer.tensor_split(size))
    incoming = torch.empty_like(chunks[0])
    for step in range(size - 1):  # reduce-scatter: chunk (position - step) travels forward
        send_index = (position - step) % size
        recv_index = (position - step - 1) % size
        target = chunks[recv_index]
        scratch = incoming[: target.numel()]
        _exchange(chunks[send_index].contiguous(), send_to, scratch, receive_from)
        target.add_(scratch)
    for step in range(size - 1):  # all-gather: the finished chunk (position + 1 - step) travels on
        send_index = (position + 1 - step) % size
        recv_index = (position - step) % size
        target = chunks[recv_index]
        scratch = incoming[: target.numel()]
        _exchange(chunks[send_index].contiguous(), send_to, scratch, receive_from)
        target.copy_(scratch)


def sample_weight(members: Sequence[int], rank: int, sizes: Sequence[int]) -> float:
    """This rank's weight in its group's mean: its share of the group's samples (`sizes`, by rank),
    or an equal share when no member has a sample."""
    total = sum(sizes[m] for m in members)
    return sizes[rank] / total if total > 0 else 1.0 / len(members)


def weighted_group_mean(
    buffer: torch.Tensor, members: Sequence[int], rank: int, sizes: Sequence[int]
) -> None:
    """In place: `buffer` becomes the members' mean weighted by their samples this step (a replica
    trained on more samples counts more: Σ b_j·x_j / Σ b_j), the same bits on every member. It keeps
    the sample-weighted mean over all ranks, Σ b_i·x_i / Σ b_i, unchanged when every step splits the
    same way, as the plain mean keeps the plain one."""
    buffer.mul_(sample_weight(members, rank, sizes))
    group_ring_sum(buffer, members, rank)
