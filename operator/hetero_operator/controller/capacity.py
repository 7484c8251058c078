"""Keeps the GPU capacity gauges current: a task beside the scheduling loop, over the same indexes.

Capacity changes with nodes and pods, not with scheduling decisions, so it is exported on its own
short timer rather than from the cycle; it starts once the loop's first cycle has run, when the
indexes hold the whole cluster (earlier, a partial view would read as lost capacity).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import kopf

from hetero_operator.controller.inventory import ClusterView, gpu_capacity
from hetero_operator.controller.metrics import OperatorMetrics
from hetero_operator.controller.scheduling_loop import INDEX_NAMES, SchedulingLoop

log = logging.getLogger(__name__)

EXPORT_EVERY_SECONDS = 5.0
SYNC_POLL_SECONDS = 0.5


async def export_capacity(
    memo: kopf.Memo,
    indexes: Mapping[str, Mapping[str, Iterable[object]]],
    every: float = EXPORT_EVERY_SECONDS,
) -> None:
    """Every `every` seconds, the capacity per class into the operator's gauges. Waits for the
    scheduling loop (started by another startup handler) and its first cycle."""
    while not _synced(getattr(memo, "loop", None)):
        await asyncio.sleep(SYNC_POLL_SECONDS)
    metrics: OperatorMetrics = memo.metrics
    while True:
        get = indexes.get
        try:
            view = ClusterView.from_indexes(
                get("htj_classes") or {}, get("htj_nodes") or {}, get("htj_jobs") or {}, get("htj_pods") or {}
            )
            metrics.set_gpu_capacity(gpu_capacity(view))
        except Exception:  # one bad pass must not end the export for good
            log.exception("exporting the GPU capacity failed; retrying")
        await asyncio.sleep(every)


def _synced(loop: SchedulingLoop | None) -> bool:
    return loop is not None and loop.cycles > 0


@kopf.on.startup()
async def start_capacity_export(memo: kopf.Memo, **kwargs: Any) -> None:
    indexes = {name: kwargs[name] for name in INDEX_NAMES}
    memo.capacity_task = asyncio.create_task(export_capacity(memo, indexes), name="heterotrain GPU capacity")


@kopf.on.cleanup()
async def stop_capacity_export(memo: kopf.Memo, **_: Any) -> None:
    task = getattr(memo, "capacity_task", None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
