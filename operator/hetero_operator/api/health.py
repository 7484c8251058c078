"""What /healthz and /readyz decide, kept apart from HTTP so each rule is a plain function.

Liveness: the event loop that serves the API (the operator's own, when embedded) keeps ticking, and
the host's long-running tasks have not ended. A failing liveness probe restarts the pod, so it only
fails for states a restart can cure.

Readiness: the Kubernetes API server answers, and the host says it is ready (for the operator: its
kopf indexes have synced and the scheduling loop has run a cycle, or another replica acts and this
one stands by). A failing readiness probe only takes the pod out of its Service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

DEFAULT_HEARTBEAT_SECONDS = 1.0
DEFAULT_MAX_STALL_SECONDS = 10.0
OK = "ok"


@dataclass(frozen=True)
class Check:
    """One probe check: passed or not, and what a human should read (the reason when it failed)."""

    ok: bool
    detail: str = OK


def passed(checks: Mapping[str, Check]) -> bool:
    return all(check.ok for check in checks.values())


def details(checks: Mapping[str, Check]) -> dict[str, str]:
    return {name: check.detail for name, check in checks.items()}


class HostChecks(Protocol):
    """What the process around the API adds to its probes."""

    def liveness(self) -> Mapping[str, Check]: ...

    def readiness(self) -> Mapping[str, Check]: ...


# --- the event loop --------------------------------------------------------------------------------


def stall_check(seconds_since_tick: float, max_stall_seconds: float) -> Check:
    """The serving loop's heartbeat last ticked `seconds_since_tick` ago; longer than the limit means
    something held the loop (blocking work in a handler), and every task in it waited as long."""
    if seconds_since_tick <= max_stall_seconds:
        return Check(True)
    return Check(
        False,
        f"the event loop did not run its heartbeat for {seconds_since_tick:.1f} s "
        f"(limit {max_stall_seconds:.0f} s): something blocks it",
    )


@dataclass
class Heartbeat:
    """A task in the serving event loop that notes the time every `period` seconds."""

    period: float = DEFAULT_HEARTBEAT_SECONDS
    max_stall_seconds: float = DEFAULT_MAX_STALL_SECONDS
    clock: Callable[[], float] = time.monotonic
    last_tick: float = field(default_factory=time.monotonic)

    async def run(self) -> None:
        while True:
            self.last_tick = self.clock()
            await asyncio.sleep(self.period)

    def check(self) -> Check:
        return stall_check(self.clock() - self.last_tick, self.max_stall_seconds)


# --- the operator around the API ---------------------------------------------------------------------


def task_check(task: asyncio.Task[None] | None) -> Check:
    """A task that should run as long as the process does."""
    if task is None:
        return Check(False, "not started")
    if not task.done():
        return Check(True)
    if task.cancelled():
        return Check(False, "cancelled")
    error = task.exception()
    return Check(False, f"ended: {error!r}" if error is not None else "ended")


def inventory_check(cycles: int, standby: bool) -> Check:
    """Ready once the scheduling loop has run a cycle: it starts only after the kopf indexes hold every
    node, pod and job that existed at start, so a first cycle means the inventory has synced. A standby
    replica (another one acts) runs no cycles but is ready to take over: its indexes fill when it does."""
    if cycles > 0:
        return Check(True)
    if standby:
        return Check(True, "standby: another replica acts")
    return Check(False, "waiting for the kopf indexes to sync (no scheduling cycle yet)")


@dataclass(frozen=True)
class OperatorChecks:
    """The operator's part of the probes. `cycles` and `standby` are read at probe time; `tasks` are
    the operator's own long-running tasks (the scheduling loop), by name."""

    cycles: Callable[[], int]
    tasks: Callable[[], Mapping[str, asyncio.Task[None] | None]]
    standby: Callable[[], bool] = lambda: False

    def liveness(self) -> Mapping[str, Check]:
        return {name: task_check(task) for name, task in self.tasks().items()}

    def readiness(self) -> Mapping[str, Check]:
        return {"inventory": inventory_check(self.cycles(), self.standby())}
