"""Free GPUs per class, indexed so a cycle never enumerates GPU subsets.

Each class keeps its schedulable nodes in buckets by free-GPU count. Picking GPUs for a job walks
the buckets from the fullest node down (fewest nodes) and finishes on the smallest node that covers
the rest (best fit, so big holes stay whole for big jobs). Buckets are insertion-ordered dicts, so
the same snapshot always yields the same picks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from hetero_operator.scheduler.snapshot import GPUClassInfo, Snapshot

# (node name, GPUs taken there)
NodeTake = tuple[str, int]


class ClassFreeIndex:
    """Schedulable nodes of one class bucketed by free GPUs."""

    def __init__(self, largest_free: int) -> None:
        self._buckets: list[dict[str, None]] = [{} for _ in range(largest_free + 1)]
        self._free: dict[str, int] = {}
        self.total_free = 0

    def add(self, node: str, free: int) -> None:
        self._free[node] = free
        self._buckets[free][node] = None
        self.total_free += free

    def free_on(self, node: str) -> int:
        return self._free.get(node, 0)

    def take(self, node: str, count: int) -> None:
        free = self._free[node]
        if count > free:
            raise ValueError(f"node {node}: taking {count} GPUs but only {free} are free")
        del self._buckets[free][node]
        self._free[node] = free - count
        self._buckets[free - count][node] = None
        self.total_free -= count

    def usable(self, chunk: int) -> int:
        """GPUs that can be handed out in whole chunks (a chunk never spans nodes)."""
        if chunk == 1:
            return self.total_free
        return sum(len(nodes) * (free // chunk * chunk) for free, nodes in enumerate(self._buckets))

    def _descending(self) -> Iterator[str]:
        for free in range(len(self._buckets) - 1, 0, -1):
            yield from self._buckets[free]

    def _best_fit(self, need: int, picked: set[str]) -> str | None:
        for free in range(need, len(self._buckets)):
            for node in self._buckets[free]:
                if node not in picked:
                    return node
        return None

    def plan(self, want: int, chunk: int = 1, avoid: frozenset[str] = frozenset()) -> list[NodeTake] | None:
        """Nodes and counts giving ``want`` GPUs (a multiple of ``chunk``) on few nodes, without
        changing the index; ``None`` if they are not there. ``avoid`` nodes are skipped."""
        if want <= 0:
            return []
        picked: set[str] = set(avoid)
        picks: list[NodeTake] = []
        remaining = want
        largest_first = self._descending()
        while remaining > 0:
            fit = self._best_fit(remaining, picked)
            if fit is not None:
                picks.append((fit, remaining))
                return picks
            for node in largest_first:
                if node not in picked:
                    break
            else:
                return None
            usable = self._free[node] // chunk * chunk
            if usable == 0:
                return None
            picks.append((node, usable))
            picked.add(node)
            remaining -= usable
        return picks


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    gpu_class: str
    allocatable: int
    schedulable: bool
    others: int


class ClusterState:
    """Mutable bookkeeping for one cycle: free GPUs per class and what every job holds."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.classes: dict[str, GPUClassInfo] = {
            c.name: c for c in sorted(snapshot.classes, key=lambda c: c.name)
        }
        self.nodes: dict[str, NodeFacts] = {
            n.name: NodeFacts(n.name, n.gpu_class, n.gpus_allocatable, n.schedulable, n.gpus_used_by_others)
            for n in sorted(snapshot.nodes, key=lambda n: n.name)
        }
        self.held: dict[str, Counter[str]] = {
            job.key: job.current.gpus_per_node() for job in snapshot.jobs if job.current is not None
        }
        held_on_node: Counter[str] = Counter()
        for per_node in self.held.values():
            held_on_node.update(per_node)
        largest = max((n.allocatable for n in self.nodes.values()), default=0)
        self.free: dict[str, ClassFreeIndex] = {name: ClassFreeIndex(largest) for name in self.classes}
        self.capacity: Counter[str] = Counter()
        # GPUs on the largest schedulable node of each class (how many nodes a set of it needs).
        self.largest_node: Counter[str] = Counter()
        # GPUs that old workers of resized or moved jobs are handing back (see `NodeInfo`).
        self.releasing: Counter[str] = Counter()
        for info in snapshot.nodes:
            if info.schedulable:
                self.releasing[info.gpu_class] += info.gpus_releasing
        self.node_count: Counter[str] = Counter(n.gpu_class for n in snapshot.nodes)
        self.excluded: dict[str, Counter[str]] = {name: Counter() for name in self.classes}
        for info in snapshot.nodes:
            if not info.schedulable:
                self.excluded[info.gpu_class].update(info.exclusions or ("unschedulable",))
        for node in self.nodes.values():
            if not node.schedulable:
                continue
            self.capacity[node.gpu_class] += node.allocatable
            self.largest_node[node.gpu_class] = max(self.largest_node[node.gpu_class], node.allocatable)
            free = max(0, node.allocatable - node.others - held_on_node[node.name])
            self.free[node.gpu_class].add(node.name, free)

    def class_of(self, node: str) -> str:
        return self.nodes[node].gpu_class

    def is_schedulable(self, node: str) -> bool:
        return self.nodes[node].schedulable

    def commit(self, job_key: str, takes: list[NodeTake]) -> None:
        """Give ``takes`` to a job (on top of anything it holds)."""
        per_node = self.held.setdefault(job_key, Counter())
        for node, count in takes:
            self.free[self.class_of(node)].take(node, count)
            per_node[node] += count

    def free_gpus(self) -> dict[str, int]:
        return {name: index.total_free for name, index in self.free.items()}

    def others_on_schedulable_nodes(self) -> list[tuple[str, int]]:
        """(class, GPUs) held by other workloads, one entry per node: they may leave too."""
        return [(n.gpu_class, n.others) for n in self.nodes.values() if n.schedulable and n.others > 0]
