"""`GPUClass` status: each class's usable nodes, GPUs and free GPUs, and its speed as the throughput
catalog's workloads measured it (`class_speed`), as `kubectl get gpuclass` shows them. Decided from
the cycle's view (pure), written at most once per interval per class, so a burst of placements costs a
few writes, not one per cycle."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from hetero_operator.controller.class_speed import measured_speeds
from hetero_operator.controller.inventory import ClusterView, gpu_capacity
from hetero_operator.controller.k8s import HETEROTRAIN, KubeClient, KubeError
from hetero_operator.resources import GPUClassStatus

log = logging.getLogger(__name__)

# At most one status write per class in this many seconds.
MIN_INTERVAL_SECONDS = 5.0


def desired_statuses(view: ClusterView) -> dict[str, GPUClassStatus]:
    """What each class's status should say now (every class, so one without usable nodes reads 0)."""
    capacity = gpu_capacity(view)
    nodes: Counter[str] = Counter(
        gpu_class for name, gpu_class in view.node_class.items() if view.schedulable(view.nodes[name])
    )
    priors = {n: c.relative_speed for n, c in view.classes.items()}
    speeds = measured_speeds(view.profiles.values(), priors)
    statuses = {}
    for name, facts in view.classes.items():
        measured = speeds.get(name)
        statuses[name] = GPUClassStatus(
            nodes=nodes[name],
            gpus=capacity[name].total,
            free_gpus=capacity[name].free,
            measured_speed=measured.speed if measured is not None else None,
            measured_workloads=measured.jobs if measured is not None else 0,
            observed_generation=facts.generation or None,
        )
    return statuses


@dataclass(frozen=True)
class StatusWrites:
    due: dict[str, GPUClassStatus]  # write these now
    wake_in: float | None  # a change held back by the interval: look again after this long


def status_writes(
    desired: Mapping[str, GPUClassStatus],
    reported: Mapping[str, GPUClassStatus | None],
    sent: Mapping[str, GPUClassStatus],
    last_sent_at: Mapping[str, float],
    now: float,
) -> StatusWrites:
    """The statuses to write: those that differ from what the class carries and from what was last
    sent (the watch may not show it yet), once the class's interval has passed (pure)."""
    due: dict[str, GPUClassStatus] = {}
    waits: list[float] = []
    for name, status in desired.items():
        if status == reported.get(name) or status == sent.get(name):
            continue
        wait = last_sent_at.get(name, -MIN_INTERVAL_SECONDS) + MIN_INTERVAL_SECONDS - now
        if wait > 0:
            waits.append(wait)
        else:
            due[name] = status
    return StatusWrites(due, min(waits) if waits else None)


def status_path(name: str) -> str:
    return f"{HETEROTRAIN}/gpuclasses/{name}/status"


def status_patch(status: GPUClassStatus) -> dict[str, object]:
    """The merge patch that sets `status`: a field it leaves unset is cleared (null), so a measured
    speed whose jobs are all gone does not linger."""
    cleared: dict[str, object] = {field: None for field in ("measuredSpeed", "observedGeneration")}
    return {"status": {**cleared, **status.to_wire()}}


@dataclass
class ClassStatusWriter:
    """Writes the due class statuses beside the loop; a failed write is retried by a later cycle."""

    client: KubeClient
    sent: dict[str, GPUClassStatus] = field(default_factory=dict)
    last_sent_at: dict[str, float] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def sync(self, view: ClusterView, now: float) -> float | None:
        """Queue the due writes; returns when a held-back change wants the loop again."""
        reported = {name: facts.reported for name, facts in view.classes.items()}
        writes = status_writes(desired_statuses(view), reported, self.sent, self.last_sent_at, now)
        for name, status in writes.due.items():
            self.sent[name], self.last_sent_at[name] = status, now
            task = asyncio.get_running_loop().create_task(self._write(name, status))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        return writes.wake_in

    async def _write(self, name: str, status: GPUClassStatus) -> None:
        try:
            await self.client.merge_patch(status_path(name), status_patch(status))
        except KubeError as error:
            self.sent.pop(name, None)  # not written: the next due cycle tries again
            if error.status != 404:  # a class deleted meanwhile needs no status
                log.warning("GPUClass %s status not written: %s", name, error)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
