"""The scheduler's input: one immutable picture of GPU classes, nodes and jobs.

Every type is a frozen dataclass so a snapshot can be shared, hashed where useful and never changed
while a cycle runs. Constructors check their fields and raise `SnapshotError` naming the field and
the fix, so a bad snapshot fails loudly at the boundary instead of deep inside a cycle.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from hetero_operator.resources import AllocationPolicy, Strategy
from hetero_operator.scheduler.queues import QueueInfo
from hetero_operator.scheduler.snapshot_errors import SnapshotError
from hetero_operator.scheduler.snapshot_errors import require as _require

__all__ = ["SnapshotError"]


@dataclass(frozen=True, slots=True)
class GPUClassInfo:
    """A kind of GPU. ``relative_speed`` is the prior throughput against a reference GPU (1.0)."""

    name: str
    relative_speed: float
    memory_gib: float
    cost_weight: float = 1.0
    resource_name: str = "nvidia.com/gpu"

    def __post_init__(self) -> None:
        _require(bool(self.name), "classes[].name: must not be empty")
        _require(
            math.isfinite(self.relative_speed) and self.relative_speed > 0,
            f"classes[{self.name}].relative_speed: must be a positive number, got {self.relative_speed}",
        )
        _require(
            self.memory_gib > 0, f"classes[{self.name}].memory_gib: must be positive, got {self.memory_gib}"
        )
        _require(
            self.cost_weight >= 0, f"classes[{self.name}].cost_weight: must be >= 0, got {self.cost_weight}"
        )


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A GPU node. ``gpus_used_by_others`` counts GPUs taken by pods that are *not* workers of a job
    in the snapshot (other workloads, or workers of jobs being deleted): the GPUs of snapshot jobs
    are known from their allocations. Unschedulable, NotReady or tainted nodes stay in the snapshot
    with ``schedulable=False`` so allocations on them remain accounted for; nothing new lands there.
    ``gpus_releasing``: of ``gpus_used_by_others``, those held by old workers of a job of the
    snapshot that a resize or move is stopping (free once they have saved a checkpoint).
    """

    name: str
    gpu_class: str
    gpus_allocatable: int
    gpus_used_by_others: int = 0
    gpus_releasing: int = 0
    schedulable: bool = True
    # Why an unschedulable node is left out, one phrase per filter ("not Ready", "cordoned",
    # "taint k=v:NoSchedule not tolerated"), for the wait reasons.
    exclusions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require(bool(self.name), "nodes[].name: must not be empty")
        _require(self.gpus_allocatable >= 0, f"nodes[{self.name}].gpus_allocatable: must be >= 0")
        _require(
            self.gpus_used_by_others >= 0,
            f"nodes[{self.name}].gpus_used_by_others: must be >= 0, got {self.gpus_used_by_others}",
        )
        _require(
            0 <= self.gpus_releasing <= self.gpus_used_by_others,
            f"nodes[{self.name}].gpus_releasing: must be between 0 and gpus_used_by_others "
            f"({self.gpus_used_by_others}), got {self.gpus_releasing}",
        )


@dataclass(frozen=True, slots=True)
class WorkerSlot:
    """One worker of an allocation: a GPU on a node; HetPipe workers also name their virtual worker
    and pipeline stage."""

    rank: int
    node: str
    gpu_class: str
    gpus: int = 1
    virtual_worker: int | None = None
    stage: int | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    """The GPUs a job holds, one slot per worker, ordered by rank."""

    workers: tuple[WorkerSlot, ...]

    def __post_init__(self) -> None:
        ranks = [w.rank for w in self.workers]
        _require(
            ranks == list(range(len(ranks))),
            f"allocation.workers: ranks must be 0..n-1 in order, got {ranks}",
        )
        _require(all(w.gpus >= 1 for w in self.workers), "allocation.workers[].gpus: must be >= 1")

    @property
    def total_gpus(self) -> int:
        return sum(w.gpus for w in self.workers)

    def gpus_per_node(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for w in self.workers:
            counts[w.node] += w.gpus
        return counts

    def gpus_per_class(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for w in self.workers:
            counts[w.gpu_class] += w.gpus
        return counts


@dataclass(frozen=True, slots=True)
class ClassProfile:
    """Measured per-GPU performance model on one class (ms; batch in samples): compute time
    ``alpha*b + beta`` and first-bucket-ready time ``alpha_sync*b + beta_sync``."""

    alpha_ms: float
    beta_ms: float
    alpha_sync_ms: float
    beta_sync_ms: float


@dataclass(frozen=True, slots=True)
class MeasuredProfile:
    """What a job measured while running: per-class GPU models and its all-reduce times (ms)."""

    per_class: tuple[tuple[str, ClassProfile], ...]
    t_o_ms: float
    t_u_ms: float

    @classmethod
    def from_mapping(
        cls, per_class: Mapping[str, ClassProfile], t_o_ms: float, t_u_ms: float
    ) -> MeasuredProfile:
        return cls(tuple(sorted(per_class.items())), t_o_ms, t_u_ms)

    def __post_init__(self) -> None:
        _require(
            bool(self.per_class), "profile.per_class: at least one measured class is needed, or pass None"
        )
        _require(self.t_o_ms >= 0 and self.t_u_ms >= 0, "profile.t_o_ms/t_u_ms: must be >= 0")


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What the scheduler needs to know about one HeteroTrainJob.

    ``allowed_classes`` is in preference order (empty: any class). ``current`` is the allocation the
    job holds (``None`` while queued). ``max_local_batch`` caps the local batch per GPU of a class.
    ``exact_mix`` (GPUs per class): a quota system admitted the job on exactly these GPUs; it is
    placed on them or waits, and is never grown (see `admitted`). ``remaining_s``: seconds of
    training left on ``current`` (its status's ETA; ``None`` when not known).
    """

    key: str
    gpus_min: int
    gpus_max: int
    global_batch: int
    created_at: float
    queue: str = "default"
    priority: int = 0
    allowed_classes: tuple[str, ...] = ()
    strategy: Strategy = Strategy.DATA
    max_local_batch: Mapping[str, int] = field(default_factory=dict)
    virtual_worker_size: int | None = None
    allocation_policy: AllocationPolicy = AllocationPolicy.AUTO
    current: Allocation | None = None
    preemptible: bool = True
    profile: MeasuredProfile | None = None
    exact_mix: Mapping[str, int] | None = None
    remaining_s: float | None = None

    def __post_init__(self) -> None:
        namespace, _, name = self.key.partition("/")
        _require(bool(namespace and name), f"jobs[].key: must be 'namespace/name', got {self.key!r}")
        _require(self.gpus_min >= 1, f"jobs[{self.key}].gpus_min: must be >= 1, got {self.gpus_min}")
        _require(
            self.gpus_max >= self.gpus_min,
            f"jobs[{self.key}].gpus_max: must be >= gpus_min ({self.gpus_min}), got {self.gpus_max}",
        )
        _require(
            self.global_batch >= self.gpus_min,
            f"jobs[{self.key}].global_batch: must be >= gpus_min so every GPU gets a sample, "
            f"got {self.global_batch}",
        )
        _require(math.isfinite(self.created_at), f"jobs[{self.key}].created_at: must be a finite timestamp")
        _require(bool(self.queue), f"jobs[{self.key}].queue: must not be empty (use 'default')")
        _require(
            len(set(self.allowed_classes)) == len(self.allowed_classes),
            f"jobs[{self.key}].allowed_classes: must not repeat a class, got {list(self.allowed_classes)}",
        )
        bad = sorted(c for c, v in self.max_local_batch.items() if v < 1)
        _require(not bad, f"jobs[{self.key}].max_local_batch: limits must be >= 1 (classes {bad})")
        _require(
            self.remaining_s is None or (math.isfinite(self.remaining_s) and self.remaining_s >= 0),
            f"jobs[{self.key}].remaining_s: must be a finite number of seconds >= 0, got {self.remaining_s}",
        )
        if self.virtual_worker_size is not None:
            _require(
                1 <= self.virtual_worker_size <= self.gpus_max,
                f"jobs[{self.key}].virtual_worker_size: must be between 1 and gpus_max ({self.gpus_max})",
            )
        if self.exact_mix is not None:
            bad = sorted(c for c, v in self.exact_mix.items() if v < 1 or v % self.chunk)
            _require(
                bool(self.exact_mix) and not bad,
                f"jobs[{self.key}].exact_mix: needs at least one class, each with a positive multiple of "
                f"{self.chunk} GPUs (classes {bad})",
            )
            object.__setattr__(self, "exact_mix", MappingProxyType(dict(self.exact_mix)))
        # Freeze the mapping so a snapshot cannot change under a running cycle.
        object.__setattr__(self, "max_local_batch", MappingProxyType(dict(self.max_local_batch)))

    @property
    def namespace(self) -> str:
        return self.key.partition("/")[0]

    @property
    def chunk(self) -> int:
        """GPUs that must be added or removed together: a virtual worker for HetPipe, else one."""
        if self.strategy is Strategy.HETPIPE:
            return self.virtual_worker_size or 1
        return 1

    def allows(self, gpu_class: str) -> bool:
        return not self.allowed_classes or gpu_class in self.allowed_classes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle looks at. ``now`` is in the same clock as ``created_at``."""

    classes: tuple[GPUClassInfo, ...]
    nodes: tuple[NodeInfo, ...]
    jobs: tuple[JobRequest, ...]
    now: float = 0.0
    # Empty: one unlimited queue, as before queues existed (see `queues`).
    queues: tuple[QueueInfo, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", tuple(self.classes))
        object.__setattr__(self, "nodes", tuple(self.nodes))
        object.__setattr__(self, "jobs", tuple(self.jobs))
        object.__setattr__(self, "queues", tuple(self.queues))
        _require_unique([c.name for c in self.classes], "classes[].name")
        _require_unique([n.name for n in self.nodes], "nodes[].name")
        _require_unique([j.key for j in self.jobs], "jobs[].key")
        _require_unique([q.name for q in self.queues], "queues[].name")
        class_names = {c.name for c in self.classes}
        for queue in self.queues:
            unknown = sorted(c for c in queue.quotas if c not in class_names)
            _require(
                not unknown,
                f"queues[{queue.name}].quotas: {', '.join(unknown)} is not a GPUClass in the snapshot; "
                "create the GPUClass or remove the quota",
            )
        nodes = {n.name: n for n in self.nodes}
        for node in self.nodes:
            _require(
                node.gpu_class in class_names,
                f"nodes[{node.name}].gpu_class: {node.gpu_class!r} is not a GPUClass in the snapshot; "
                "add the class or leave the node out",
            )
        for job in self.jobs:
            if job.current is None:
                continue
            for slot in job.current.workers:
                _require(
                    slot.node in nodes,
                    f"jobs[{job.key}].current: worker {slot.rank} is on node {slot.node!r}, which is not in "
                    "the snapshot; keep lost nodes with schedulable=False or re-queue the job (current=None)",
                )
                _require(
                    nodes[slot.node].gpu_class == slot.gpu_class,
                    f"jobs[{job.key}].current: worker {slot.rank} says class {slot.gpu_class!r} but node "
                    f"{slot.node!r} is {nodes[slot.node].gpu_class!r}",
                )


def _require_unique(names: list[str], field_name: str) -> None:
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    _require(not repeated, f"{field_name}: must be unique, repeated: {', '.join(repeated)}")
