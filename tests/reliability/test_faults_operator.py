"""The operator SIGKILLed again and again, each kill aimed at a phase of a job's life, while short job
lifecycles run on KWOK nodes.

More jobs than the fake GPUs hold are in flight, so some always wait (Queued) while others start and
run. Jobs succeed, fail once and restart after a backoff, fail until out of restarts, are suspended
(their workers drain for the checkpoint grace) and resumed, or are deleted (the finalizer is pending
until the operator cleans up). Each kill is one trial, aimed by watching the jobs' phases (see
`faults_kills`); the moves that bring a phase about (a failure, a suspension, a deletion) are made
just before a kill aimed at it. At every poll no rank may have two live pods and no node may hand out
more GPUs than it has; every job must end in its expected phase with the expected restart count and
nothing stale, and nothing may be left once every job is deleted.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from tests.operator.live import OperatorProcess
from tests.reliability.faults_cluster import Cluster, describe, duplicate_workers, remains
from tests.reliability.faults_kills import (
    DELETING,
    DRAINING,
    PHASES,
    RESTARTING,
    STARTING,
    AimedKills,
    phases_present,
)
from tests.reliability.faults_lifecycles import (
    RESTART_BACKOFF,
    Delete,
    Finish,
    Kind,
    Lifecycle,
    MoveKind,
    Suspend,
    next_move,
    plan_lifecycles,
    summary,
)

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(480)]

SEED = 9001
KILLS = 54  # nine aimed at each phase
MAX_LIFECYCLES = 160  # jobs are started as others end, up to this many
MIX = (Kind.SUCCEED, Kind.FAIL_ONCE, Kind.FAIL_OUT, Kind.SUSPEND, Kind.DELETE)
IN_FLIGHT = 24  # jobs of 2 GPUs: 48 GPUs asked of the 40 fake ones, so some always wait
GRACE_SECONDS = 4.0  # the operator's checkpoint grace: how long a suspended job drains
# Pods start this long after they are bound, as a kubelet's pull and start make them. Without it a
# fake pod runs at once and Starting can pass between two polls, so kills aimed at it miss.
START_DELAY = "1500ms"
READY = "indexes ready"  # what the operator logs once it works on jobs
KILL_SECONDS = 330.0  # the kills stop here even if fewer were made (at least 50 must be)
WIND_DOWN_SECONDS = 90.0  # then every lifecycle has this long to end
POLL_SECONDS = 0.2
IDLE_POLL_SECONDS = 0.5
# The move that brings each phase about, made only when a kill is aimed at that phase.
BRINGS_ABOUT = {MoveKind.FAIL: RESTARTING, MoveKind.SUSPEND: DRAINING, MoveKind.DELETE: DELETING}


@dataclass
class Kill:
    phase: str
    jobs_in_phase: list[str]
    in_flight: list[str]  # lifecycles under way at the kill
    problems: list[str] = field(default_factory=list)


@dataclass
class Moves:
    """Which moves the driver makes at one poll: any while winding down; otherwise a job finishes
    once it has seen a kill, and a move that brings a phase about is made only when a kill is armed
    and aimed at that phase and no job is in it (one such move per poll)."""

    aim: AimedKills
    now: float
    present: set[str]
    winding_down: bool
    made: list[MoveKind] = field(default_factory=list)

    def allow(self, life: Lifecycle, kind: MoveKind) -> bool:
        if self.winding_down or kind is MoveKind.RESUME:
            return True
        armed = self.aim.armed(self.now) and not self.made
        if kind is MoveKind.FINISH:
            # A kill aimed at Starting frees GPUs at once, so a waiting job is placed.
            if life.kills > 0:
                return True
            if armed and self.aim.target == STARTING:
                self.made.append(kind)
                return True
            return False
        wanted = BRINGS_ABOUT[kind]
        if armed and self.aim.target == wanted and wanted not in self.present:
            self.made.append(kind)
            return True
        return False


@pytest.fixture
def bed(fault_bed: Testbed) -> Testbed:
    return fault_bed


def test_operator_killed_in_every_phase_of_job_lifecycles(  # type: ignore[no-untyped-def]
    bed: Testbed, record, tmp_path: Path
) -> None:
    namespace = f"kill-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    cluster = Cluster(str(bed.kubeconfig), namespace)
    pending: deque[Lifecycle] = deque(plan_lifecycles(MAX_LIFECYCLES, SEED, MIX))
    lives: list[Lifecycle] = []
    active: list[Lifecycle] = []
    kills: list[Kill] = []
    broken: list[str] = []  # problems not tied to one kill
    aim = AimedKills(SEED, KILLS)
    operator = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=GRACE_SECONDS)
    starts = 0
    started = time.monotonic()
    winding_down: float | None = None
    operator.start()
    aim.started(started)
    try:
        while active or (pending and winding_down is None):
            now = time.monotonic()
            if winding_down is None and (aim.done or now - started > KILL_SECONDS):
                winding_down = now
                if operator.process is None or operator.process.poll() is not None:
                    operator.start()
            if winding_down is not None and now - winding_down > WIND_DOWN_SECONDS:
                break
            if operator.log.read_text().count(READY) > starts:
                starts += 1
                aim.ready(now)
                print(f"{now - started:6.1f} s: operator ready")
            if winding_down is None and aim.start_due(now):
                operator.start()
                print(f"{now - started:6.1f} s: operator started")
                aim.started(now)
            while winding_down is None and pending and len(active) < IN_FLIGHT:
                life = pending.popleft()
                cluster.apply(life.manifest(namespace, START_DELAY))
                life.applied_at = now
                active.append(life)
                lives.append(life)
            known = len(cluster.problems)
            snapshot = cluster.poll()
            assert snapshot is not None, "the API server stopped answering"
            present = phases_present(snapshot)
            for problem in cluster.problems[known:]:
                (kills[-1].problems if kills else broken).append(problem)
            phase = aim.choose(set(present), now) if winding_down is None else None
            if phase is not None:
                operator.kill()
                starts = operator.log.read_text().count(READY)
                kills.append(Kill(phase, present[phase], [life.name for life in active]))
                print(f"{now - started:6.1f} s: kill {len(kills)} in {phase} (aimed at {aim.target})")
                aim.killed(phase, now)
                for life in active:
                    life.kills += 1
            moves = Moves(aim, now, set(present), winding_down is not None)
            duplicates = duplicate_workers(snapshot)
            for life in active:
                for problem in duplicates.get(life.name, []):
                    life.note(problem)
                move = next_move(life, snapshot, now, may_act=moves.allow)
                if isinstance(move, Finish):
                    cluster.finish(move.pods, move.code)
                elif isinstance(move, Delete):
                    cluster.delete(life.name)
                elif isinstance(move, Suspend):
                    cluster.suspend(life.name, move.value)
                if not life.done and winding_down is not None and now - winding_down > WIND_DOWN_SECONDS - 1:
                    life.note(f"not finished; phases {life.phases_seen}; now {describe(snapshot, life.name)}")
                    life.done = True
            for life in active:
                if life.done and life.kind is not Kind.DELETE and life.name in snapshot.jobs:
                    # Settled: delete it, so the cluster (and each restart's listing) stays small.
                    cluster.delete(life.name)
            active = [life for life in active if not life.done]
            if not moves.made:
                # After a move aimed at a phase, look again at once; while no kill is armed, less often.
                time.sleep(POLL_SECONDS if aim.armed(now) else IDLE_POLL_SECONDS)
        elapsed = time.monotonic() - started
        if operator.process is None or operator.process.poll() is not None:
            operator.start()
        # At rest: delete every job; the surviving operator removes everything they owned.
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false")
        try:
            cluster.until(lambda s: not remains(s), 30, "every job and object to be gone")
        except AssertionError as error:
            broken.append(f"{error}: {remains(cluster.snapshot)}")
    finally:
        operator.stop()
        print(f"--- operator log ---\n{operator.tail(40)}")
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    unfinished = [life.name for life in lives if not life.done]
    failed = {life.name: life.problems for life in lives if life.problems}
    for kill in kills:
        kill.problems += [f"{name}: {failed[name]}" for name in kill.in_flight if name in failed]
    survived = 0 if broken else sum(1 for kill in kills if not kill.problems)
    per_phase = ", ".join(f"{phase} {aim.kills[phase]}" for phase in PHASES)
    record(
        area="fault",
        what=(
            f"operator SIGKILLed {len(kills)} times (one trial each), each kill aimed at a job phase "
            f"and made at the first poll that showed a job in it; kills per phase: {per_phase} "
            f"({aim.fallbacks} landed in another phase than the one aimed at, after {aim.patience:g} s "
            f"without it; {aim.startup_kills} while the operator was still starting up); restarted "
            f"{aim.down[0]:g}-{aim.down[1]:g} s after each kill (seed {SEED}); {len(lives)} KWOK job "
            f"lifecycles ({summary(lives)}), {IN_FLIGHT} of 2 GPUs at a time on 40 GPUs; pods start "
            f"{START_DELAY} after binding; backoff "
            f"{RESTART_BACKOFF} s, checkpoint grace {GRACE_SECONDS:g} s; {elapsed:.0f} s"
        ),
        trials=len(kills),
        survived=survived,
        lost="nothing"
        if not failed and not broken and not unfinished
        else f"{len(failed)} lifecycles broke: {failed}; unfinished {unfinished}; cluster: {broken}",
        checks=(
            "at every poll no rank had two live pods and no node more GPUs in use than it has; each job "
            "ended in its expected phase (Succeeded, Failed, or deleted) with the expected "
            "status.restarts, only its last generation's pods left, everything owned by it; after all "
            "jobs were deleted no pod, Service or ConfigMap was left. A kill survived when nothing broke "
            "between it and the next kill and every job under way at it ended as expected"
        ),
    )
    print(f"{len(lives)} lifecycles and {len(kills)} operator kills in {elapsed:.0f} s; {per_phase}")
    assert len(kills) >= 50, f"only {len(kills)} kills in {KILL_SECONDS:.0f} s: {per_phase}"
    assert all(aim.kills[phase] >= 3 for phase in PHASES), per_phase
    assert not unfinished, f"lifecycles still running at the deadline: {unfinished}"
    assert not failed, failed
    assert not broken, broken
