"""When to SIGKILL the operator: aimed at job phases, with seeded-random delays.

Every kill is aimed at one phase of a job's life (Queued, Starting, Running, Restarting, Draining,
being deleted), taking the phases in turn. Once the operator is armed (a random time after it is
ready, or, a share of the time, while it is still starting up), it is killed at the first snapshot
that shows a job in that phase. A phase that does not show up within `patience` seconds gives way
to the least-killed phase that does, so the run always moves on; the counts say where kills landed.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from tests.reliability.faults_cluster import Body, Snapshot, status

QUEUED, STARTING, RUNNING, RESTARTING = "Queued", "Starting", "Running", "Restarting"
DRAINING, DELETING = "Draining", "being deleted"
PHASES = (QUEUED, STARTING, RUNNING, RESTARTING, DRAINING, DELETING)


def phase_of(job: Body) -> str:
    """The phase a kill lands in for this job: being deleted (finalizer pending) and Draining (its
    workers were asked to save a checkpoint before they stop) come before status.phase."""
    if job["metadata"].get("deletionTimestamp"):
        return DELETING
    state = status(job)
    conditions = state.get("conditions") or []
    if any(c.get("type") == DRAINING and c.get("status") == "True" for c in conditions):
        return DRAINING
    return str(state.get("phase") or "not yet seen")


def phases_present(snapshot: Snapshot) -> dict[str, list[str]]:
    """Phase -> the jobs in it."""
    found: dict[str, list[str]] = {}
    for name, job in sorted(snapshot.jobs.items()):
        found.setdefault(phase_of(job), []).append(name)
    return found


@dataclass
class AimedKills:
    seed: int
    total: int  # kills to make
    after_ready: tuple[float, float] = (0.1, 0.6)  # seconds after ready before a kill may land
    in_startup: tuple[float, float] = (0.3, 1.2)  # seconds after start, for start-up kills
    startup_share: float = 0.3
    down: tuple[float, float] = (0.1, 0.5)  # seconds between a kill and the next start
    patience: float = 4.0
    kills: Counter[str] = field(default_factory=Counter)  # per phase
    startup_kills: int = 0  # kills that landed before the operator was ready
    fallbacks: int = 0  # kills that landed in another phase than the one aimed at
    aimed: int = 0  # kills made so far
    armed_at: float | None = None
    restart_at: float | None = None
    is_ready: bool = False
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    @property
    def done(self) -> bool:
        return sum(self.kills.values()) >= self.total

    @property
    def target(self) -> str:
        return PHASES[self.aimed % len(PHASES)]

    def started(self, now: float) -> None:
        self.restart_at = None
        self.is_ready = False
        during_startup = self.rng.random() < self.startup_share
        self.armed_at = now + self.rng.uniform(*self.in_startup) if during_startup else None

    def ready(self, now: float) -> None:
        self.is_ready = True
        if self.armed_at is None and self.restart_at is None:
            self.armed_at = now + self.rng.uniform(*self.after_ready)

    def armed(self, now: float) -> bool:
        return not self.done and self.armed_at is not None and now >= self.armed_at

    def choose(self, present: set[str], now: float) -> str | None:
        """The phase to kill in now, or None: not armed, or the target not there (yet)."""
        if not self.armed(now):
            return None
        if self.target in present:
            return self.target
        assert self.armed_at is not None
        if now - self.armed_at < self.patience:
            return None
        there = [phase for phase in PHASES if phase in present]
        return min(there, key=lambda phase: self.kills[phase]) if there else None

    def killed(self, phase: str, now: float) -> None:
        if phase != self.target:
            self.fallbacks += 1
        self.kills[phase] += 1
        self.aimed += 1
        self.startup_kills += 0 if self.is_ready else 1
        self.armed_at = None
        self.restart_at = now + self.rng.uniform(*self.down)

    def start_due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at
