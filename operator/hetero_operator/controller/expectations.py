"""What this replica has set in motion and is waiting to see through the watches.

Creating a generation's objects and adding the finalizer go through the API server at once, but the
watch shows them a while later (tens of seconds with thousands of pods). Meanwhile cycles would do
the same again and earn 409s; these records say when doing it again is due. Every timing comes from
the injected clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hetero_operator.controller.actions import Generation
from hetero_operator.controller.clock import Clock

# A generation whose objects could not all be created is tried again after this long; one whose
# creation went through is only re-checked after RECHECK_SECONDS (a pod deleted by hand since).
RETRY_SECONDS = 5.0
RECHECK_SECONDS = 60.0


class CreationState(StrEnum):
    QUEUED = "queued"  # behind the job's status write
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class _Mark:
    at: float
    state: CreationState


class CreationExpectations:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._marks: dict[Generation, _Mark] = {}

    def mark(self, generation: Generation, state: CreationState) -> None:
        self._marks[generation] = _Mark(self._clock.monotonic(), state)

    def due(self, generation: Generation) -> bool:
        found = self._marks.get(generation)
        if found is None:
            return True
        age = self._clock.monotonic() - found.at
        if found.state is CreationState.FAILED:
            return age > RETRY_SECONDS
        return found.state is CreationState.DONE and age > RECHECK_SECONDS

    def write_failed(self, key: str) -> None:
        """A write of this job failed before its queued creation ran: a later cycle retries it."""
        for generation, found in list(self._marks.items()):
            if generation[0] == key and found.state is CreationState.QUEUED:
                self.mark(generation, CreationState.FAILED)

    def not_due(self, generations: list[Generation]) -> frozenset[Generation]:
        return frozenset(g for g in generations if not self.due(g))

    def prune(self) -> None:
        """Forget finished records once they are older than a re-check."""
        fresh = self._clock.monotonic() - RECHECK_SECONDS
        self._marks = {
            g: m
            for g, m in self._marks.items()
            if m.state in (CreationState.QUEUED, CreationState.RUNNING) or m.at > fresh
        }


class FinalizerExpectations:
    """Jobs our finalizer was just added to (key -> (uid, when))."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._added: dict[str, tuple[str, float]] = {}

    def due(self, key: str, uid: str) -> bool:
        added = self._added.get(key)
        if added is None or added[0] != uid:
            return True
        return self._clock.monotonic() - added[1] > RECHECK_SECONDS  # taken off since? add it again

    def adding(self, key: str, uid: str) -> None:
        self._added[key] = (uid, self._clock.monotonic())

    def seen(self, key: str) -> None:
        self._added.pop(key, None)

    def failed(self, key: str) -> None:
        self._added.pop(key, None)

    def prune(self, keys: set[str]) -> None:
        self._added = {k: v for k, v in self._added.items() if k in keys}


class WorkloadExpectations:
    """Jobs whose new Kueue Workload was created but is not in the watch yet (key -> (name,
    when)): meanwhile no cycle proposes another one for them."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._creating: dict[str, tuple[str, float]] = {}

    def creating(self, key: str, name: str) -> None:
        self._creating[key] = (name, self._clock.monotonic())

    def failed(self, key: str) -> None:
        self._creating.pop(key, None)

    def pending(self, seen: set[str]) -> frozenset[str]:
        """Jobs still waiting to see their Workload; `seen`: "namespace/name" of the Workloads the
        watch shows. A record older than a re-check is dropped (the Workload was deleted since)."""
        stale = self._clock.monotonic() - RECHECK_SECONDS
        self._creating = {
            key: (name, at)
            for key, (name, at) in self._creating.items()
            if f"{key.split('/', 1)[0]}/{name}" not in seen and at > stale
        }
        return frozenset(self._creating)
