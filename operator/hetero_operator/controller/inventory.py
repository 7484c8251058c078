"""From the kopf indexes to one immutable view of the cluster, and from that view to the scheduler's
snapshot (pure apart from reading the index objects it is handed).

GPU nodes belong to the GPUClass whose nodeSelector they match. A node that is cordoned, NotReady or
carries a NoSchedule/NoExecute taint its class does not tolerate stays in the snapshot with
`schedulable=False`, so GPUs held there are still counted. GPUs requested by any pod that is not a
current worker of a job in the snapshot count as used by others.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from hetero_operator.controller.catalog import known_profile, split_speeds, workload_key
from hetero_operator.controller.facts import ClassFacts, JobFacts, NodeFacts, PodFacts, QueueFacts
from hetero_operator.controller.launcher import ClassLaunchInfo
from hetero_operator.controller.queue_status import snapshot_queues
from hetero_operator.kueue.facts import (
    ClusterQueueFacts,
    FlavorFacts,
    KueueView,
    LocalQueueFacts,
    WorkloadFacts,
)
from hetero_operator.resources import Allocation as StatusAllocation
from hetero_operator.resources import AllocationPolicy, HeteroTrainJob, HeteroTrainJobStatus, MeasuredProfile
from hetero_operator.resources.parallelism import HetPipeParameters
from hetero_operator.scheduler import (
    Allocation,
    ClassProfile,
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    Snapshot,
    WorkerSlot,
)
from hetero_operator.scheduler import MeasuredProfile as SchedulerProfile
from hetero_operator.scheduler.charging import Charging

NO_JOB = "-"
"""Pod index key of pods that belong to no HeteroTrainJob."""


def pod_index_key(pod: PodFacts) -> str:
    return f"{pod.namespace}/{pod.job}" if pod.job else NO_JOB


def _flatten(index: Mapping[str, Iterable[object]]) -> Iterable[tuple[str, object]]:
    for key in list(index):
        for value in index.get(key, ()):
            yield key, value


@dataclass(frozen=True)
class ClusterView:
    """Everything one cycle reads, taken from the indexes at one moment."""

    classes: Mapping[str, ClassFacts]
    nodes: Mapping[str, NodeFacts]
    jobs: Mapping[str, JobFacts]
    pods_by_job: Mapping[str, tuple[PodFacts, ...]]
    node_class: Mapping[str, str] = field(default_factory=dict)
    kueue: KueueView = field(default_factory=KueueView)
    queues: Mapping[str, QueueFacts] = field(default_factory=dict)
    profiles: Mapping[str, MeasuredProfile] = field(default_factory=dict)  # workload key -> estimate

    @classmethod
    def build(
        cls,
        classes: Iterable[ClassFacts],
        nodes: Iterable[NodeFacts],
        jobs: Iterable[JobFacts],
        pods: Iterable[PodFacts],
        kueue: KueueView | None = None,
        queues: Iterable[QueueFacts] = (),
        profiles: Mapping[str, MeasuredProfile] | None = None,
    ) -> ClusterView:
        class_map = {c.name: c for c in sorted(classes, key=lambda c: c.name)}
        node_map = {n.name: n for n in nodes}
        by_job: dict[str, list[PodFacts]] = defaultdict(list)
        for pod in pods:
            by_job[pod_index_key(pod)].append(pod)
        node_class = {}
        for node in node_map.values():
            gpu_class = classify(node, class_map.values())
            if gpu_class is not None:
                node_class[node.name] = gpu_class
        return cls(
            classes=class_map,
            nodes=node_map,
            jobs={j.key: j for j in jobs},
            pods_by_job={key: tuple(sorted(values, key=lambda p: p.name)) for key, values in by_job.items()},
            node_class=node_class,
            kueue=kueue or KueueView(),
            queues={q.name: q for q in sorted(queues, key=lambda q: q.name)},
            profiles=dict(profiles or {}),
        )

    @classmethod
    def from_indexes(
        cls,
        classes: Mapping[str, Iterable[object]],
        nodes: Mapping[str, Iterable[object]],
        jobs: Mapping[str, Iterable[object]],
        pods: Mapping[str, Iterable[object]],
        kueue: Mapping[str, Mapping[str, Iterable[object]]] | None = None,
        queues: Mapping[str, Iterable[object]] | None = None,
        profiles: Mapping[str, Iterable[object]] | None = None,
    ) -> ClusterView:
        return cls.build(
            (v for _, v in _flatten(classes) if isinstance(v, ClassFacts)),
            (v for _, v in _flatten(nodes) if isinstance(v, NodeFacts)),
            (v for _, v in _flatten(jobs) if isinstance(v, JobFacts)),
            (v for _, v in _flatten(pods) if isinstance(v, PodFacts)),
            kueue_view(kueue) if kueue else None,
            (v for _, v in _flatten(queues or {}) if isinstance(v, QueueFacts)),
            {k: v for k, v in _flatten(profiles or {}) if isinstance(v, MeasuredProfile)},
        )

    def with_jobs(self, jobs: Mapping[str, JobFacts]) -> ClusterView:
        return replace(self, jobs=jobs)

    def pods_of(self, job_key: str) -> tuple[PodFacts, ...]:
        return self.pods_by_job.get(job_key, ())

    def all_pods(self) -> Iterable[PodFacts]:
        for pods in self.pods_by_job.values():
            yield from pods

    def schedulable(self, node: NodeFacts) -> bool:
        return self.node_class.get(node.name) in self.classes and not self.exclusions(node)

    def exclusions(self, node: NodeFacts) -> tuple[str, ...]:
        """Every filter that keeps new workers off a classified node, as phrases for wait reasons."""
        gpu_class = self.classes.get(self.node_class.get(node.name, ""))
        found = []
        if not node.ready:
            found.append("not Ready")
        if node.unschedulable:
            found.append("cordoned")
        if gpu_class is not None:
            if node.allocatable.get(gpu_class.resource_name, 0) <= 0:
                found.append(f"no {gpu_class.resource_name} allocatable")
            found += [
                f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect} not tolerated"
                for taint in node.taints
                if not gpu_class.tolerates(taint)
            ]
        return tuple(found)

    def healthy(self, node_name: str, gpu_class: str) -> bool:
        """A node an allocation may keep using: still there, Ready and still of the same class."""
        node = self.nodes.get(node_name)
        return node is not None and node.ready and self.node_class.get(node_name) == gpu_class

    def lost_nodes(self, allocation: StatusAllocation | None) -> frozenset[str]:
        if allocation is None:
            return frozenset()
        return frozenset(w.node for w in allocation.workers if not self.healthy(w.node, w.gpu_class))

    def speeds(self) -> dict[str, float]:
        return {name: c.relative_speed for name, c in self.classes.items()}

    def workload_estimate(self, job: HeteroTrainJob) -> MeasuredProfile | None:
        """The throughput catalog's estimate for the job's workload key (None: never measured). Every
        job asks each cycle: with an empty catalog no key is derived."""
        return self.profiles.get(workload_key(job.spec)) if self.profiles else None

    def known_profile(self, job: HeteroTrainJob, status: HeteroTrainJobStatus) -> MeasuredProfile | None:
        """What the job's placement goes by: its own measurement, else its workload's profile."""
        return known_profile(status.measured, self.workload_estimate(job))

    def job_speeds(self, job: HeteroTrainJob, status: HeteroTrainJobStatus) -> dict[str, float]:
        """The per-class speeds the job's first plans split by (`catalog.split_speeds`)."""
        return split_speeds(job.spec, self.speeds(), self.known_profile(job, status))

    def launch_classes(self) -> dict[str, ClassLaunchInfo]:
        return {name: ClassLaunchInfo(c.resource_name, c.tolerations) for name, c in self.classes.items()}


KUEUE_INDEX_NAMES = ("htj_workloads", "htj_local_queues", "htj_cluster_queues", "htj_flavors")


def kueue_view(indexes: Mapping[str, Mapping[str, Iterable[object]]]) -> KueueView:
    """Kueue's objects from their indexes (absent ones read as empty)."""

    def values(name: str) -> list[object]:
        return [v for _, v in _flatten(indexes.get(name) or {})]

    return KueueView.build(
        (v for v in values("htj_workloads") if isinstance(v, WorkloadFacts)),
        (v for v in values("htj_local_queues") if isinstance(v, LocalQueueFacts)),
        (v for v in values("htj_cluster_queues") if isinstance(v, ClusterQueueFacts)),
        (v for v in values("htj_flavors") if isinstance(v, FlavorFacts)),
    )


def classify(node: NodeFacts, classes: Iterable[ClassFacts]) -> str | None:
    """The class whose selector the node matches; the most specific selector wins, then the name."""
    matches = [c for c in classes if c.node_selector and c.selects(node.labels)]
    if not matches:
        return None
    return min(matches, key=lambda c: (-len(c.node_selector), c.name)).name


# --- the scheduler's snapshot --------------------------------------------------------------------


def job_request(
    facts: JobFacts,
    job: HeteroTrainJob,
    status: HeteroTrainJobStatus,
    holding: bool,
    movable: bool = True,
    exact_mix: Mapping[str, int] | None = None,
    now: float | None = None,
    catalog: MeasuredProfile | None = None,
) -> JobRequest:
    """The scheduler's view of one job. `movable`: the scheduler may resize or preempt it (not while
    it drains for an earlier decision). `exact_mix`: Kueue admitted it on exactly these GPUs per
    class (its only allowed classes)."""
    spec = job.spec
    params = spec.parallelism.parameters()
    virtual_worker_size = params.virtual_worker_size if isinstance(params, HetPipeParameters) else None
    policy = params.allocation_policy if isinstance(params, HetPipeParameters) else AllocationPolicy.AUTO
    current = None
    if holding and status.allocation is not None:
        current = Allocation(
            tuple(
                WorkerSlot(
                    rank=w.rank,
                    node=w.node,
                    gpu_class=w.gpu_class,
                    gpus=w.gpus,
                    virtual_worker=w.virtual_worker,
                    stage=w.stage,
                )
                for w in status.allocation.workers
            )
        )
    return JobRequest(
        key=facts.key,
        gpus_min=spec.gpus.min,
        gpus_max=spec.gpus.max,
        global_batch=spec.batch.global_batch,
        # Arrival order: when the operator queued it (microseconds), else creation (whole seconds).
        created_at=status.queued_at.timestamp() if status.queued_at is not None else facts.created_at,
        queue=spec.queue,
        priority=spec.priority,
        allowed_classes=tuple(exact_mix) if exact_mix is not None else tuple(spec.gpu_classes),
        strategy=spec.parallelism.strategy,
        max_local_batch=dict(spec.batch.per_gpu_class_max),
        virtual_worker_size=virtual_worker_size,
        allocation_policy=policy,
        current=current,
        preemptible=movable,
        profile=scheduler_profile(known_profile(status.measured, catalog)),
        exact_mix=exact_mix,
        remaining_s=status.progress.time_left(now)
        if current is not None and status.progress is not None
        else None,
    )


def scheduler_profile(measured: MeasuredProfile | None) -> SchedulerProfile | None:
    """The job's own measured speed per class, as the scheduler predicts its placements with (the
    GPUClass priors scale it to classes the job has not run on)."""
    if measured is None or not measured.classes:
        return None
    per_class = {
        c.gpu_class: ClassProfile(
            c.compute_ms_per_sample, c.compute_fixed_ms, c.sync_ready_ms_per_sample, c.sync_ready_fixed_ms
        )
        for c in measured.classes
    }
    return SchedulerProfile.from_mapping(
        per_class, measured.overlapped_allreduce_ms, measured.last_bucket_allreduce_ms
    )


def build_snapshot(
    view: ClusterView, requests: Iterable[JobRequest], now: float, charging: Charging | None = None
) -> Snapshot:
    """Nodes with the GPUs others use, GPU classes, queues and the jobs' requests, as the scheduler
    wants them. A queue's usage is what its status last recorded, charged on to ``now`` at the rate
    its jobs hold GPUs (`queue_status.charged_usage`).

    A job in the snapshot uses, on each node, the larger of what its allocation says and what its
    live pods hold (old pods may still be saving a checkpoint); the part beyond its allocation counts
    as used by others, and as being released."""
    jobs = tuple(requests)
    in_snapshot = {job.key: job for job in jobs}
    others: Counter[str] = Counter()
    releasing: Counter[str] = Counter()
    for key, pods in view.pods_by_job.items():
        job = in_snapshot.get(key)
        held_by_pods: Counter[str] = Counter()
        for pod in pods:
            if pod.live and pod.node is not None and pod.node in view.node_class:
                resource = view.classes[view.node_class[pod.node]].resource_name
                held_by_pods[pod.node] += pod.resources.get(resource, 0)
        allocated = job.current.gpus_per_node() if job is not None and job.current is not None else Counter()
        for node, count in held_by_pods.items():
            beyond = max(0, count - allocated.get(node, 0))
            others[node] += beyond
            if job is not None:
                releasing[node] += beyond
    nodes = []
    for name in sorted(view.node_class):
        facts = view.nodes[name]
        gpu_class = view.classes[view.node_class[name]]
        nodes.append(
            NodeInfo(
                name=name,
                gpu_class=gpu_class.name,
                gpus_allocatable=facts.allocatable.get(gpu_class.resource_name, 0),
                gpus_used_by_others=others[name],
                gpus_releasing=releasing[name],
                schedulable=view.schedulable(facts),
                exclusions=view.exclusions(facts),
            )
        )
    classes = tuple(
        GPUClassInfo(
            name=c.name,
            relative_speed=c.relative_speed,
            memory_gib=c.memory_gib,
            cost_weight=c.cost_weight,
            resource_name=c.resource_name,
        )
        for c in view.classes.values()
    )
    queues = snapshot_queues(view.queues, jobs, classes, tuple(nodes), now, charging or Charging())
    return Snapshot(classes=classes, nodes=tuple(nodes), jobs=jobs, now=now, queues=queues)


# --- GPU capacity, for the operator's gauges -------------------------------------------------------


@dataclass(frozen=True)
class ClassCapacity:
    """GPUs of one class on Ready, schedulable nodes, and how many of them no live pod requests."""

    total: int = 0
    free: int = 0


def gpu_capacity(view: ClusterView) -> dict[str, ClassCapacity]:
    """Capacity per GPUClass; every class is listed, so a class without usable nodes reads 0."""
    requested: Counter[str] = Counter()
    for pod in view.all_pods():
        if pod.live and pod.node is not None and pod.node in view.node_class:
            resource = view.classes[view.node_class[pod.node]].resource_name
            requested[pod.node] += pod.resources.get(resource, 0)
    total: Counter[str] = Counter()
    free: Counter[str] = Counter()
    for name, gpu_class in view.node_class.items():
        node = view.nodes[name]
        if not view.schedulable(node):
            continue
        gpus = node.allocatable.get(view.classes[gpu_class].resource_name, 0)
        total[gpu_class] += gpus
        free[gpu_class] += max(0, gpus - requested[name])
    return {name: ClassCapacity(total[name], free[name]) for name in view.classes}
