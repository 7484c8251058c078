"""When to SIGKILL the operator and when to start it again, drawn from one seeded generator.

Most kills land a random time after the operator is ready (its indexes are full and it is working on
jobs: placing, creating pods, restarting, finishing, removing finalizers); a share land while it is
still starting up (listing the cluster, filling its indexes).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class KillSchedule:
    seed: int
    working: tuple[float, float] = (0.3, 2.5)  # seconds after ready
    starting: tuple[float, float] = (0.3, 2.0)  # seconds after start, for start-up kills
    down: tuple[float, float] = (0.2, 1.5)  # seconds between a kill and the next start
    startup_share: float = 0.2
    kill_at: float | None = None
    restart_at: float | None = None
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)

    def started(self, now: float) -> None:
        self.restart_at = None
        during_startup = self.rng.random() < self.startup_share
        self.kill_at = now + self.rng.uniform(*self.starting) if during_startup else None

    def ready(self, now: float) -> None:
        if self.kill_at is None and self.restart_at is None:
            self.kill_at = now + self.rng.uniform(*self.working)

    def killed(self, now: float) -> None:
        self.kill_at = None
        self.restart_at = now + self.rng.uniform(*self.down)

    def kill_due(self, now: float) -> bool:
        return self.kill_at is not None and now >= self.kill_at

    def start_due(self, now: float) -> bool:
        return self.restart_at is not None and now >= self.restart_at
