"""What a cycle sees of each job: the watch, unless this replica knows a newer status.

Two things are newer than the watch for a while after a write: a status handed to the job's write
chain and not stored yet (assumed, as a scheduler's cache assumes a binding until it lands), and a
body the API server returned for a write of ours (the watch shows it a moment later). Pure
bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hetero_operator.controller.facts import JobFacts


def revision(resource_version: str) -> int:
    """resourceVersions from one etcd are increasing integers; anything else sorts first."""
    try:
        return int(resource_version)
    except ValueError:
        return 0


def newer(candidate: str, than: str) -> bool:
    try:
        return int(candidate) > int(than)
    except ValueError:
        return False


class StatusCache:
    def __init__(self) -> None:
        self._written: dict[str, JobFacts] = {}
        self._assumed: dict[str, JobFacts] = {}

    def overlay(self, indexed: Mapping[str, JobFacts]) -> dict[str, JobFacts]:
        """The jobs as cycles should see them; forgets written bodies the watch has caught up with."""
        jobs = dict(indexed)
        for key, written in list(self._written.items()):
            seen = jobs.get(key)
            if seen is None or not newer(written.resource_version, seen.resource_version):
                del self._written[key]  # the watch caught up (or the job is gone)
            else:
                jobs[key] = written
        for key, assumed in self._assumed.items():
            if key in jobs:
                jobs[key] = assumed
        return jobs

    def assume(self, key: str, facts: JobFacts) -> None:
        self._assumed[key] = facts

    def settle(self, key: str, assumed: JobFacts) -> None:
        """The write carrying `assumed` ended (stored or not): stop assuming it, unless a later
        cycle has assumed a newer status meanwhile."""
        if self._assumed.get(key) is assumed:
            del self._assumed[key]

    def drop(self, key: str) -> None:
        """A write failed: the next cycle falls back to the watch."""
        self._assumed.pop(key, None)

    def wrote(self, key: str, body: JobFacts) -> None:
        self._written[key] = body

    def forget(self, key: str) -> None:
        self._written.pop(key, None)
        self._assumed.pop(key, None)

    def freshest(self, key: str, indexed: Iterable[JobFacts]) -> JobFacts | None:
        """The newest stored state of a job: the watch's or this replica's last write."""
        seen = [self._written.get(key), *indexed]
        return max(
            (f for f in seen if f is not None and f.model is not None),
            key=lambda f: revision(f.resource_version),
            default=None,
        )
