"""Per-job tasks beside the scheduling loop: one task per job that wants one, running a pass every
few seconds. The loop calls `sync` at the end of each cycle, so the tasks run only on the active
replica and need no finalizer of their own (a deleted or stopped job's task is cancelled by the next
cycle). The rebalancer and the progress reporter are both run this way."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from hetero_operator.controller.clock import Clock
from hetero_operator.controller.facts import JobFacts
from hetero_operator.resources import HeteroTrainJob

log = logging.getLogger("heterotrain.tasks")


class JobPass(Protocol):
    """What a job's task does every tick; returns the seconds until the next pass."""

    def __call__(self, job: HeteroTrainJob) -> Awaitable[float]: ...


def running(facts: JobFacts) -> bool:
    return facts.model is not None and not facts.deleting and facts.phase == "Running"


def wants_rebalancer(facts: JobFacts) -> bool:
    """A running job whose spec leaves rebalancing on."""
    return running(facts) and facts.model is not None and facts.model.spec.rebalance.enabled


class JobTaskRunner:
    def __init__(
        self,
        name: str,
        wants: Callable[[JobFacts], bool],
        start: Callable[[str], JobPass],
        newest: Callable[[str], JobFacts | None],
        clock: Clock,
        first_pause: float = 2.0,
        on_stop: Callable[[str], None] | None = None,
    ) -> None:
        """`start(key)`: a fresh pass function (with its own memory) for a job that starts wanting a
        task; `newest(key)`: the freshest facts of a job, read before every pass."""
        self.name = name
        self.wants = wants
        self.start = start
        self.newest = newest
        self.clock = clock
        self.first_pause = first_pause
        self.on_stop = on_stop
        self._tasks: dict[str, asyncio.Task[None]] = {}

    @property
    def running(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def sync(self, jobs: Mapping[str, JobFacts]) -> None:
        """One task for every job that wants one, none for the others."""
        wanted = {key for key, facts in jobs.items() if self.wants(facts)}
        for key in [k for k in self._tasks if k not in wanted]:
            self._tasks.pop(key).cancel()
        for key in sorted(wanted):
            task = self._tasks.get(key)
            if task is None or task.done():  # a task that ended on an error starts again
                self._tasks[key] = asyncio.create_task(self._run(key), name=f"{self.name} {key}")

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, key: str) -> None:
        run_pass = self.start(key)
        pause = self.first_pause
        log.info("%s: %s started", key, self.name)
        try:
            while True:
                await self.clock.sleep(pause)
                facts = self.newest(key)
                if facts is None or facts.model is None:
                    continue  # the next cycle stops this task if the job is gone
                try:
                    pause = await run_pass(facts.model)
                except Exception as err:  # a failed pass must never end the job's task
                    log.warning("%s: %s pass failed: %s", key, self.name, err)
                    pause = self.first_pause
        finally:
            log.info("%s: %s stopped", key, self.name)
            if self.on_stop is not None:
                self.on_stop(key)
