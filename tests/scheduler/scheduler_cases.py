"""Builders and hypothesis strategies shared by the scheduler tests."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import strategies as st

from hetero_operator.scheduler import (
    Allocation,
    Decisions,
    GPUClassInfo,
    JobRequest,
    NodeInfo,
    SchedulerConfig,
    Snapshot,
    schedule,
)


def job(
    key: str, gpus: int, *, arrived: float = 0.0, gpus_max: int | None = None, **fields: object
) -> JobRequest:
    """A data-parallel job needing ``gpus`` GPUs (up to ``gpus_max``), global batch 256 by default."""
    fields.setdefault("global_batch", 256)
    return JobRequest(
        key=f"ns/{key}" if "/" not in key else key,
        gpus_min=gpus,
        gpus_max=gpus_max or gpus,
        created_at=arrived,
        **fields,  # type: ignore[arg-type]
    )


def nodes(gpu_class: str, count: int, gpus: int, prefix: str | None = None) -> tuple[NodeInfo, ...]:
    prefix = prefix or gpu_class
    return tuple(NodeInfo(f"{prefix}-{i}", gpu_class, gpus) for i in range(count))


def held_after(snapshot: Snapshot, decisions: Decisions) -> dict[str, Counter[str]]:
    """GPUs per node each job holds once the decisions are applied (preempted jobs still hold
    theirs until they have checkpointed, so they are counted)."""
    held: dict[str, Counter[str]] = {}
    for request in snapshot.jobs:
        if request.current is not None:
            held[request.key] = request.current.gpus_per_node()
    for key, allocation in decisions.place.items():
        held[key] = allocation.gpus_per_node()
    for resizes in (decisions.grow, decisions.shrink):
        for key, resize in resizes.items():
            held[key] = resize.allocation.gpus_per_node()
    return held


def run_with_current(snapshot: Snapshot, config: SchedulerConfig | None = None) -> Snapshot:
    """Schedule once and return the snapshot in which placed jobs are running (``current`` set)."""
    decisions = schedule(snapshot, config)
    jobs = tuple(
        replace(j, current=decisions.place[j.key]) if j.key in decisions.place else j for j in snapshot.jobs
    )
    return replace(snapshot, jobs=jobs)


CLASS_SPEEDS = {"fast": 2.0, "mid": 1.0, "slow": 0.5}


@st.composite
def small_snapshots(draw: st.DrawFn, *, with_running: bool = True) -> Snapshot:
    """A few nodes of up to three classes, some jobs already running, more jobs queued in two queues."""
    class_names = draw(st.lists(st.sampled_from(sorted(CLASS_SPEEDS)), min_size=1, max_size=3, unique=True))
    classes = tuple(GPUClassInfo(c, CLASS_SPEEDS[c], 16.0) for c in sorted(class_names))
    node_list: list[NodeInfo] = []
    for gpu_class in sorted(class_names):
        for i in range(draw(st.integers(1, 3))):
            size = draw(st.integers(1, 4))
            node_list.append(
                NodeInfo(
                    f"{gpu_class}-{i}",
                    gpu_class,
                    size,
                    gpus_used_by_others=draw(st.integers(0, 1)) if size > 1 else 0,
                    schedulable=draw(st.booleans()) or i == 0,
                )
            )
    all_classes = [*sorted(class_names), "other"]

    def draw_jobs(prefix: str, count: int, start: float) -> list[JobRequest]:
        out = []
        for i in range(count):
            low = draw(st.integers(1, 5))
            allowed = draw(st.lists(st.sampled_from(all_classes), max_size=2, unique=True))
            out.append(
                JobRequest(
                    key=f"ns/{prefix}{i}",
                    gpus_min=low,
                    gpus_max=low + draw(st.integers(0, 3)),
                    global_batch=draw(st.sampled_from([16, 64, 256])),
                    created_at=start + i,
                    queue=draw(st.sampled_from(["q1", "q2"])),
                    priority=draw(st.integers(0, 2)),
                    allowed_classes=tuple(allowed),
                    preemptible=draw(st.booleans()),
                )
            )
        return out

    first = Snapshot(
        classes,
        tuple(node_list),
        tuple(draw_jobs("run", draw(st.integers(0, 4)) if with_running else 0, 0.0)),
    )
    # Let the scheduler itself place the first jobs (without growth) so running allocations are consistent.
    running = run_with_current(first, SchedulerConfig(elastic=draw(st.booleans())))
    started = tuple(j for j in running.jobs if j.current is not None)
    queued = draw_jobs("job", draw(st.integers(1, 5)), 100.0)
    return Snapshot(classes, tuple(node_list), (*started, *queued), now=200.0)


def allocation_nodes(allocation: Allocation) -> set[str]:
    return {w.node for w in allocation.workers}
