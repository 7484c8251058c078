"""Grouping GPUs into virtual workers of k GPUs (HetPipe's NP, ED and HD policies, plus auto).

- NP (node partition): every virtual worker comes from a single node.
- ED (equal distribution): with N = total/k workers, every node gives G_i/N GPUs to each.
- HD (hybrid distribution): nodes are grouped g at a time; each group yields g*G/k workers, each
  taking k/g GPUs from every node of its group. The grouping (and g) minimises the imbalance of
  per-worker compute plus the imbalance of per-worker memory, imbalance = (max - min) / mean.
- auto: the policy with the highest predicted throughput; under wave-synchronous training every
  worker runs at the slowest one's pace, so by default throughput = N * min(sum of speeds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum

from hetero_operator.planner.errors import PlanningError

# Above this many candidate groupings HD pairs nodes by speed rank instead of enumerating.
MAX_HD_GROUPINGS = 20_000


class Policy(StrEnum):
    NP = "NP"
    ED = "ED"
    HD = "HD"
    AUTO = "auto"


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_class: str
    gpus: int
    speed: float  # relative speed of one GPU
    memory_gb: float  # memory of one GPU


@dataclass(frozen=True, slots=True)
class Slot:
    node: str
    gpu_index: int


VirtualWorker = tuple[Slot, ...]


@dataclass(frozen=True, slots=True)
class Allocation:
    virtual_workers: tuple[VirtualWorker, ...]
    policy: Policy  # the concrete policy used (never AUTO)
    score: float  # predicted throughput, in units of one speed-1.0 GPU


Scorer = Callable[[Sequence[VirtualWorker]], float]


def _by_name(nodes: Sequence[Node]) -> dict[str, Node]:
    return {n.name: n for n in nodes}


def slowest_worker_throughput(nodes: Sequence[Node]) -> Scorer:
    """Default score: number of workers times the compute of the slowest one."""
    lookup = _by_name(nodes)

    def score(vws: Sequence[VirtualWorker]) -> float:
        return len(vws) * min(sum(lookup[s.node].speed for s in vw) for vw in vws)

    return score


def imbalance(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return 0.0 if mean == 0 else (max(values) - min(values)) / mean


def node_partition(nodes: Sequence[Node], k: int) -> list[VirtualWorker]:
    out: list[VirtualWorker] = []
    for node in nodes:
        for start in range(0, node.gpus - k + 1, k):
            out.append(tuple(Slot(node.name, i) for i in range(start, start + k)))
    if not out:
        raise PlanningError(f"k: no node has {k} GPUs, so NP cannot form a virtual worker")
    return out


def equal_distribution(nodes: Sequence[Node], k: int) -> list[VirtualWorker]:
    total = sum(n.gpus for n in nodes)
    if total % k:
        raise PlanningError(f"k: ED needs the {total} GPUs to split into workers of {k}")
    count = total // k
    if any(n.gpus % count for n in nodes):
        raise PlanningError(f"k: ED needs every node's GPU count to be a multiple of the {count} workers")
    return [
        tuple(Slot(n.name, i) for n in nodes for i in range(w * n.gpus // count, (w + 1) * n.gpus // count))
        for w in range(count)
    ]


def _groupings(items: list[int], size: int) -> Iterator[list[list[int]]]:
    """All partitions of ``items`` into groups of ``size`` (first item anchors each group)."""
    if not items:
        yield []
        return
    head, rest = items[0], items[1:]
    from itertools import combinations

    for mates in combinations(rest, size - 1):
        left = [x for x in rest if x not in mates]
        for tail in _groupings(left, size):
            yield [[head, *mates], *tail]


def _grouping_count(n: int, size: int) -> int:
    groups = n // size
    return math.factorial(n) // (math.factorial(size) ** groups * math.factorial(groups))


def _hd_workers(nodes: Sequence[Node], groups: list[list[int]], k: int) -> list[VirtualWorker]:
    g = len(groups[0])
    per_node = k // g
    gpus = nodes[0].gpus
    out: list[VirtualWorker] = []
    for group in groups:
        for w in range(gpus // per_node):
            out.append(
                tuple(Slot(nodes[i].name, j) for i in group for j in range(w * per_node, (w + 1) * per_node))
            )
    return out


def hybrid_distribution(nodes: Sequence[Node], k: int) -> list[VirtualWorker]:
    if len({n.gpus for n in nodes}) != 1:
        raise PlanningError("nodes: HD needs the same number of GPUs on every node")
    gpus, count = nodes[0].gpus, len(nodes)
    sizes = [g for g in range(2, count) if count % g == 0 and k % g == 0 and gpus % (k // g) == 0]
    if not sizes:
        raise PlanningError(
            f"k: HD needs a group size g (1 < g < {count}) dividing the node count and k, with k/g dividing "
            f"{gpus} GPUs per node"
        )
    lookup = _by_name(nodes)

    def badness(vws: list[VirtualWorker]) -> float:
        compute = [sum(lookup[s.node].speed for s in vw) for vw in vws]
        memory = [sum(lookup[s.node].memory_gb for s in vw) for vw in vws]
        return imbalance(compute) + imbalance(memory)

    best: tuple[float, list[VirtualWorker]] | None = None
    for g in sizes:
        for groups in _candidate_groupings(nodes, g):
            vws = _hd_workers(nodes, groups, k)
            value = badness(vws)
            if best is None or value < best[0] - 1e-12:
                best = (value, vws)
    assert best is not None
    return best[1]


def _candidate_groupings(nodes: Sequence[Node], g: int) -> Iterator[list[list[int]]]:
    idx = list(range(len(nodes)))
    if _grouping_count(len(nodes), g) <= MAX_HD_GROUPINGS:
        yield from _groupings(idx, g)
        return
    # Too many to enumerate: deal nodes in speed order snake-wise so each group mixes fast and slow.
    ranked = sorted(idx, key=lambda i: (-nodes[i].speed, i))
    count = len(nodes) // g
    groups: list[list[int]] = [[] for _ in range(count)]
    for pos, i in enumerate(ranked):
        lap, off = divmod(pos, count)
        groups[off if lap % 2 == 0 else count - 1 - off].append(i)
    yield [sorted(gr) for gr in sorted(groups, key=min)]


_BUILDERS: dict[Policy, Callable[[Sequence[Node], int], list[VirtualWorker]]] = {
    Policy.NP: node_partition,
    Policy.ED: equal_distribution,
    Policy.HD: hybrid_distribution,
}


def allocate_virtual_workers(
    nodes: Sequence[Node], k: int, policy: Policy, *, score: Scorer | None = None
) -> Allocation:
    """Virtual workers of ``k`` GPUs under ``policy``; ``auto`` tries NP, HD, ED and keeps the best.

    ``score`` (default: slowest-worker throughput) lets callers rank with a richer model, e.g. the
    pipeline partitioner. Ties go to the policy with fewer cross-node hops: NP, then HD, then ED.
    """
    if not nodes:
        raise PlanningError("nodes: at least one node is needed")
    if k < 1:
        raise PlanningError("k: must be at least 1")
    if len({n.name for n in nodes}) != len(nodes):
        raise PlanningError("nodes: names must be unique")
    scorer = score or slowest_worker_throughput(nodes)
    if policy is not Policy.AUTO:
        vws = _BUILDERS[policy](nodes, k)
        return Allocation(tuple(vws), policy, scorer(vws))
    best: Allocation | None = None
    reasons = []
    for candidate in (Policy.NP, Policy.HD, Policy.ED):
        try:
            vws = _BUILDERS[candidate](nodes, k)
        except PlanningError as exc:
            reasons.append(f"{candidate.value}: {exc}")
            continue
        value = scorer(vws)
        if best is None or value > best.score * (1 + 1e-9):
            best = Allocation(tuple(vws), candidate, value)
    if best is None:
        raise PlanningError("policy: no policy applies; " + "; ".join(reasons))
    return best


def choose_virtual_worker_size(
    nodes: Sequence[Node], policy: Policy, *, score: Scorer | None = None
) -> Allocation:
    """The virtual-worker size a spec left unset: of every k that divides the GPUs into whole
    virtual workers under ``policy``, the one whose allocation scores highest. Ties go to the
    smaller k: shorter pipelines send fewer activations and keep more data parallelism."""
    total = sum(n.gpus for n in nodes)
    best: Allocation | None = None
    reasons = []
    for k in (size for size in range(1, total + 1) if total % size == 0):
        try:
            candidate = allocate_virtual_workers(nodes, k, policy, score=score)
        except PlanningError as exc:
            reasons.append(f"k={k}: {exc}")
            continue
        if sum(len(vw) for vw in candidate.virtual_workers) != total:
            continue  # NP leaves GPUs of some nodes out at this size
        if best is None or candidate.score > best.score * (1 + 1e-9):
            best = candidate
    if best is None:
        raise PlanningError("virtualWorkerSize: no size groups every GPU; " + "; ".join(reasons))
    return best
