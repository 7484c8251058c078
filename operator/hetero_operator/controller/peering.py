"""Which replica acts: kopf's peering rule, read back so the operator's own tasks follow it too.

kopf pauses its handlers, watches and daemons on a replica that sees a live peer of higher or equal
priority in the peering object, but it knows nothing of the tasks the operator starts itself (the
scheduling loop). `Leadership` reads the same object and runs such a task only while this replica is
the one that acts, so a standby never places, creates or deletes anything.

Priorities: replicas that share one are all paused by kopf, so each replica takes a distinct one at
start, derived from its start time: an older replica outranks a newer one. A replica that restarts
or is added later therefore joins as a standby and never takes over from a healthy active replica;
when the active one dies, the oldest survivor takes over once the dead one's entry expires (its
lifetime, `--peering-lifetime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import logging
import os
import secrets
import socket
from collections.abc import Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from hetero_operator.controller.k8s import KubeClient, KubeError

log = logging.getLogger(__name__)

PEERING_API = "/apis/kopf.dev/v1"
DEFAULT_LIFETIME_SECONDS = 60


@dataclass(frozen=True)
class PeeringConfig:
    name: str
    identity: str
    priority: int
    lifetime_seconds: int = DEFAULT_LIFETIME_SECONDS
    namespaces: tuple[str, ...] = ()  # empty: the cluster-wide peering object

    def paths(self) -> list[str]:
        """The peering objects kopf keeps this replica's entry in: one per watched namespace, or one
        cluster-wide."""
        if not self.namespaces:
            return [f"{PEERING_API}/clusterkopfpeerings/{self.name}"]
        return [f"{PEERING_API}/namespaces/{ns}/kopfpeerings/{self.name}" for ns in self.namespaces]

    def poll_seconds(self) -> float:
        """How often the peering object is read: a small part of the lifetime, which bounds a handover."""
        return min(2.0, max(0.25, self.lifetime_seconds / 10))


@dataclass(frozen=True)
class Peer:
    identity: str
    priority: int
    deadline: datetime  # when the entry expires unless renewed


def start_priority(started: datetime) -> int:
    """A priority from the start time that ranks older replicas higher (microseconds, so two replicas
    practically never share one)."""
    return -int(started.timestamp() * 1_000_000)


def own_identity() -> str:
    """The replica's name in the peering object: its pod (POD_ID) or user, host and process."""
    pod = os.environ.get("POD_ID")
    if pod:
        return pod
    return f"{getpass.getuser()}@{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(3)}"


def parse_peers(status: Mapping[str, Any]) -> list[Peer]:
    """The entries kopf writes (`<identity>: {priority, lifetime, lastseen}`); malformed ones are left out
    (kopf cannot read them either)."""
    peers = []
    for identity, entry in status.items():
        if not isinstance(entry, Mapping):
            continue
        try:
            lastseen = datetime.fromisoformat(str(entry["lastseen"]))
            if lastseen.tzinfo is None:
                lastseen = lastseen.replace(tzinfo=UTC)
            lifetime = timedelta(seconds=int(entry.get("lifetime", DEFAULT_LIFETIME_SECONDS)))
            peers.append(Peer(str(identity), int(entry.get("priority", 0)), lastseen + lifetime))
        except (KeyError, TypeError, ValueError):
            continue
    return peers


def is_active(peers: Iterable[Peer], identity: str, priority: int, now: datetime) -> bool:
    """kopf's rule (pause for any live peer of higher or equal priority), plus one more: a replica whose
    own entry has lapsed stands down, because every other replica already counts it as dead."""
    live = [peer for peer in peers if peer.deadline > now]
    if not any(peer.identity == identity for peer in live):
        return False
    return not any(peer.identity != identity and peer.priority >= priority for peer in live)


class Leadership:
    """Runs a task only while this replica acts, by reading the peering objects every poll."""

    def __init__(self, client: KubeClient, config: PeeringConfig) -> None:
        self.client = client
        self.config = config
        self._peers: dict[str, list[Peer]] = {}  # the last copy read of each peering object
        self.active = False

    async def _read(self) -> None:
        for path in self.config.paths():
            try:
                body = await self.client.get(path)
            except (KubeError, aiohttp.ClientError, TimeoutError) as error:
                # Judge by the last copy: this replica stands down once its own entry has lapsed there.
                log.debug("reading %s failed: %s", path, error)
                continue
            self._peers[path] = parse_peers((body or {}).get("status") or {})

    def _decide(self, now: datetime) -> bool:
        return all(
            is_active(self._peers.get(path, ()), self.config.identity, self.config.priority, now)
            for path in self.config.paths()
        )

    async def run_while_active(
        self,
        work: Callable[[], Coroutine[Any, Any, None]],
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Start `work` when this replica becomes the active one, cancel it when it stops being so."""
        task: asyncio.Task[None] | None = None
        try:
            while True:
                await self._read()
                active = self._decide(datetime.now(UTC))
                if active and task is None:
                    log.info("this replica (%s) is active; starting its own tasks", self.config.identity)
                    task = asyncio.create_task(work(), name="work of the active replica")
                    if on_start is not None:
                        on_start()
                elif not active and task is not None:
                    log.info("this replica (%s) is standing by; stopping its own tasks", self.config.identity)
                    await _cancel(task)
                    task = None
                elif task is not None and task.done():
                    task.result()  # the work never ends by itself: surface its failure
                self.active = task is not None
                await asyncio.sleep(self.config.poll_seconds())
        finally:
            if task is not None:
                await _cancel(task)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
