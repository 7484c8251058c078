"""Short job lifecycles on KWOK nodes, driven from outside the way workers and users would drive them.

Each lifecycle has a kind (succeed; fail once, then succeed; fail until out of restarts; be suspended,
resumed, then succeed; be deleted) and `next_move` decides, from one snapshot, what to do to it next:
finish its pods with an exit code, suspend or resume it, delete it, or settle it with the problems
found. The driver owns no operator: faults happen beside it, and it says which kinds of move it allows
at each moment (so a test can bring a phase about just before a fault).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from tests.reliability.faults_bed import kwok_job
from tests.reliability.faults_cluster import (
    Snapshot,
    leftovers,
    live,
    rank_and_generation,
    settled_problems,
    status,
)

# Seconds a finished or deleted job may take to reach its resting state (old pods gone, objects
# collected) before what is left counts as a problem.
SETTLE_SECONDS = 20.0


class Kind(StrEnum):
    SUCCEED = "succeed"
    FAIL_ONCE = "fail once, then succeed"
    FAIL_OUT = "fail until out of restarts"
    SUSPEND = "suspend, resume, then succeed"
    DELETE = "delete"


class DeleteWhen(StrEnum):
    CREATED = "created"  # right after it was applied
    PLACED = "placed"  # once it has an allocation
    RUNNING = "running"


EXPECTED: dict[Kind, tuple[str | None, int]] = {
    Kind.SUCCEED: ("Succeeded", 0),
    Kind.FAIL_ONCE: ("Succeeded", 1),
    Kind.FAIL_OUT: ("Failed", 1),
    Kind.SUSPEND: ("Succeeded", 0),
    Kind.DELETE: (None, 0),
}
# Seconds a failed job waits before its restart (its restartPolicy.backoffSeconds): long enough to
# be seen, and killed, in Restarting.
RESTART_BACKOFF = 3


@dataclass
class Lifecycle:
    name: str
    kind: Kind
    delete_when: DeleteWhen = DeleteWhen.RUNNING
    applied_at: float = 0.0
    finished_generations: set[int] = field(default_factory=set)
    failed_generations: set[int] = field(default_factory=set)
    deleted: bool = False
    suspended: bool = False  # spec.suspend was set true
    resumed: bool = False  # and then false again
    resting_since: float | None = None  # when it first reached its expected end
    done: bool = False
    problems: list[str] = field(default_factory=list)
    phases_seen: list[str] = field(default_factory=list)
    kills: int = 0  # operator kills while this lifecycle was under way

    def manifest(self, namespace: str, start_delay: str | None = None) -> dict[str, Any]:
        max_restarts = 1 if self.kind is Kind.FAIL_OUT else 2
        body = kwok_job(self.name, namespace, gpus=2, max_restarts=max_restarts, start_delay=start_delay)
        if self.kind in (Kind.FAIL_ONCE, Kind.FAIL_OUT):
            body["spec"]["restartPolicy"]["backoffSeconds"] = RESTART_BACKOFF
        return body

    def note(self, problem: str) -> None:
        if problem not in self.problems:
            self.problems.append(problem)


MIX = (Kind.SUCCEED, Kind.SUCCEED, Kind.FAIL_ONCE, Kind.FAIL_OUT, Kind.DELETE)


def plan_lifecycles(count: int, seed: int, kinds: tuple[Kind, ...] = MIX) -> list[Lifecycle]:
    """A seeded mix of kinds, shuffled, so the order of starts and faults is reproducible."""
    rng = random.Random(seed)
    chosen = [kinds[i % len(kinds)] for i in range(count)]
    rng.shuffle(chosen)
    return [Lifecycle(f"life-{i:03d}", kind, rng.choice(list(DeleteWhen))) for i, kind in enumerate(chosen)]


@dataclass(frozen=True)
class Finish:
    """Annotate these pods to exit with `code` (KWOK then ends them)."""

    pods: tuple[str, ...]
    code: int


@dataclass(frozen=True)
class Delete:
    pass


@dataclass(frozen=True)
class Suspend:
    """Set spec.suspend to `value`."""

    value: bool


Move = Finish | Delete | Suspend | None


class MoveKind(StrEnum):
    FINISH = "finish"  # every pod exits 0, or a job out of restarts fails for good
    FAIL = "fail"  # rank 0 exits 1 and the job has a restart left: it goes Restarting
    SUSPEND = "suspend"
    RESUME = "resume"
    DELETE = "delete"


Allow = Callable[[Lifecycle, MoveKind], bool]


def _anything(life: Lifecycle, kind: MoveKind) -> bool:
    return True


def _nothing(life: Lifecycle, kind: MoveKind) -> bool:
    return False


def _current_pods(snapshot: Snapshot, job: str, generation: int) -> list[dict[str, Any]]:
    return [p for p in snapshot.job_pods(job) if rank_and_generation(p)[1] == generation]


def next_move(life: Lifecycle, snapshot: Snapshot, now: float, may_act: bool | Allow = True) -> Move:
    """What to do to one lifecycle now; settles it (done, problems) once it has come to rest.
    `may_act` says which kinds of move are allowed now (all, none, or a function); a move not allowed
    is not made (and not used up)."""
    allow: Allow = may_act if callable(may_act) else _anything if may_act else _nothing
    if life.done:
        return None
    body = snapshot.jobs.get(life.name)
    phase = status(body).get("phase") if body is not None else None
    if phase and (not life.phases_seen or life.phases_seen[-1] != phase):
        life.phases_seen.append(phase)
    if life.kind is Kind.DELETE:
        return _deleting(life, snapshot, body, phase, now, allow)
    want_phase, want_restarts = EXPECTED[life.kind]
    if body is None:
        life.note("the job disappeared")
        life.done = True
        return None
    if phase in ("Succeeded", "Failed"):
        return _settle(life, snapshot, phase, want_phase, want_restarts, now)
    if phase == "Suspended" and life.suspended and not life.resumed:
        if not allow(life, MoveKind.RESUME):
            return None
        life.resumed = True
        return Suspend(False)
    allocation = status(body).get("allocation") or {}
    generation = allocation.get("generation")
    if phase != "Running" or generation is None:
        return None
    pods = [p for p in _current_pods(snapshot, life.name, generation) if live(p)]
    ranks = {worker["rank"] for worker in allocation.get("workers") or []}
    if not pods or {rank_and_generation(p)[0] for p in pods} != ranks:
        return None  # every worker of the generation must be there (an operator killed mid-creation)
    if generation in life.failed_generations | life.finished_generations:
        return None  # one move per generation; the operator acts next
    if life.kind is Kind.SUSPEND and not life.suspended:
        if not allow(life, MoveKind.SUSPEND):
            return None
        life.suspended = True
        return Suspend(True)
    if life.kind is Kind.SUSPEND and not life.resumed:
        return None  # draining: the operator stops the workers once their grace is over
    if life.kind is Kind.FAIL_OUT or (life.kind is Kind.FAIL_ONCE and not life.failed_generations):
        restart_left = not life.failed_generations
        if not allow(life, MoveKind.FAIL if restart_left else MoveKind.FINISH):
            return None
        life.failed_generations.add(generation)
        rank0 = min(pods, key=lambda p: rank_and_generation(p)[0])
        return Finish((rank0["metadata"]["name"],), 1)
    if not allow(life, MoveKind.FINISH):
        return None
    life.finished_generations.add(generation)
    return Finish(tuple(sorted(p["metadata"]["name"] for p in pods)), 0)


def _settle(
    life: Lifecycle, snapshot: Snapshot, phase: str, want_phase: str | None, want_restarts: int, now: float
) -> Move:
    body = snapshot.jobs[life.name]
    restarts = int(status(body).get("restarts") or 0)
    wrong = []
    if phase != want_phase:
        wrong.append(f"ended {phase}, expected {want_phase}")
    if restarts != want_restarts:
        wrong.append(f"status.restarts is {restarts}, expected {want_restarts}")
    problems = settled_problems(snapshot, life.name)
    if life.resting_since is None:
        life.resting_since = now
    if wrong or not problems or now - life.resting_since > SETTLE_SECONDS:
        for problem in wrong + problems:
            life.note(problem)
        life.done = True
    return None


def _deleting(
    life: Lifecycle,
    snapshot: Snapshot,
    body: dict[str, Any] | None,
    phase: str | None,
    now: float,
    allow: Allow,
) -> Move:
    if not life.deleted:
        allocation = status(body).get("allocation") or {} if body is not None else {}
        due = {
            DeleteWhen.CREATED: True,
            DeleteWhen.PLACED: bool(allocation.get("workers")),
            DeleteWhen.RUNNING: phase == "Running",
        }[life.delete_when]
        if due and allow(life, MoveKind.DELETE):
            life.deleted = True
            life.resting_since = now
            return Delete()
        return None
    left = leftovers(snapshot, life.name)
    assert life.resting_since is not None
    if not left or now - life.resting_since > SETTLE_SECONDS:
        if left:
            life.note(f"left behind {SETTLE_SECONDS:.0f} s after deletion: {left}")
        life.done = True
    return None


def summary(lives: list[Lifecycle]) -> str:
    kinds = Counter(life.kind.value for life in lives)
    return ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items()))
