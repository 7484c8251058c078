"""Writes `HeteroQueue` statuses beside the scheduling loop: at once when what it holds changes, else
every so often to carry the charged usage forward; never more than once per interval per queue."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from hetero_operator.controller.k8s import HETEROTRAIN, KubeClient, KubeError
from hetero_operator.resources import HeteroQueueStatus

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 5.0
# The charged usage and share move every cycle; recording them this often is plenty (the next cycle
# charges on from whatever was recorded last).
REFRESH_SECONDS = 60.0
_CHARGED = {"charged_usage", "charged_at", "share"}


def _counted(status: HeteroQueueStatus | None) -> HeteroQueueStatus | None:
    return None if status is None else status.model_copy(update=dict.fromkeys(_CHARGED))


def due_writes(
    desired: Mapping[str, HeteroQueueStatus],
    reported: Mapping[str, HeteroQueueStatus | None],
    last_sent: Mapping[str, HeteroQueueStatus],
    last_sent_at: Mapping[str, float],
    now: float,
) -> dict[str, HeteroQueueStatus]:
    """The statuses to write now (pure): a changed count once the interval has passed, or anything
    once the refresh period has."""
    due = {}
    for name, status in desired.items():
        since = now - last_sent_at.get(name, -REFRESH_SECONDS)
        changed = _counted(status) not in (_counted(reported.get(name)), _counted(last_sent.get(name)))
        if (changed and since >= MIN_INTERVAL_SECONDS) or since >= REFRESH_SECONDS:
            due[name] = status
    return due


def status_path(name: str) -> str:
    return f"{HETEROTRAIN}/heteroqueues/{name}/status"


@dataclass
class QueueStatusWriter:
    client: KubeClient
    sent: dict[str, HeteroQueueStatus] = field(default_factory=dict)
    last_sent_at: dict[str, float] = field(default_factory=dict)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def sync(
        self,
        desired: Mapping[str, HeteroQueueStatus],
        reported: Mapping[str, HeteroQueueStatus | None],
        now: float,
    ) -> None:
        for name, status in due_writes(desired, reported, self.sent, self.last_sent_at, now).items():
            self.sent[name], self.last_sent_at[name] = status, now
            task = asyncio.get_running_loop().create_task(self._write(name, status))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _write(self, name: str, status: HeteroQueueStatus) -> None:
        try:
            await self.client.merge_patch(status_path(name), {"status": status.to_wire()})
        except KubeError as error:
            self.sent.pop(name, None)
            if error.status != 404:
                log.warning("HeteroQueue %s status not written: %s", name, error)

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
