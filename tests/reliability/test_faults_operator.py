"""The operator SIGKILLed at seeded-random moments while 50 short job lifecycles run on KWOK nodes.

Jobs succeed, fail once and recover, fail until out of restarts, or are deleted at a random stage;
the operator is killed every few seconds (wherever it happens to be: starting up, placing, creating
pods, restarting a job, removing a finalizer) and started again. Throughout, no rank may have two
live pods and no node may hand out more GPUs than it has; at the end of every lifecycle the job must
be in the right phase with the right restart count and nothing stale or unowned left behind.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, deque
from pathlib import Path

import pytest
from tests.operator.live import OperatorProcess
from tests.reliability.faults_cluster import Cluster, describe, duplicate_workers, remains
from tests.reliability.faults_kills import KillSchedule
from tests.reliability.faults_lifecycles import Delete, Finish, Lifecycle, next_move, plan_lifecycles, summary

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(300)]

SEED = 9001
LIFECYCLES = 50
IN_FLIGHT = 20  # jobs of 2 GPUs: together they fill the 40 fake GPUs
READY = "indexes ready"  # what the operator logs once it works on jobs
LIFECYCLE_TIMEOUT = 90.0
DEADLINE_SECONDS = 200.0
POLL_SECONDS = 0.4


@pytest.fixture
def bed(fault_bed: Testbed) -> Testbed:
    return fault_bed


def test_operator_killed_at_random_points_across_job_lifecycles(  # type: ignore[no-untyped-def]
    bed: Testbed, record, tmp_path: Path
) -> None:
    namespace = f"kill-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    cluster = Cluster(str(bed.kubeconfig), namespace)
    lives = plan_lifecycles(LIFECYCLES, SEED)
    operator = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=1.0)
    pending: deque[Lifecycle] = deque(lives)
    active: list[Lifecycle] = []
    kills_at: Counter[str] = Counter()  # the phases in-flight jobs were in at each kill
    broken: list[str] = []  # problems not tied to one lifecycle
    schedule = KillSchedule(SEED)
    starts = 0
    started = time.monotonic()
    operator.start()
    schedule.started(started)
    try:
        while (pending or active) and time.monotonic() - started < DEADLINE_SECONDS:
            now = time.monotonic()
            if operator.log.read_text().count(READY) > starts:
                starts += 1
                schedule.ready(now)
            if schedule.kill_due(now):
                operator.kill()
                starts = operator.log.read_text().count(READY)
                kills_at.update(cluster.snapshot.phase(life.name) or "not yet seen" for life in active)
                for life in active:
                    life.kills += 1
                kills_at["(kills)"] += 1
                schedule.killed(now)
            elif schedule.start_due(now):
                operator.start()
                schedule.started(now)
            while pending and len(active) < IN_FLIGHT:
                life = pending.popleft()
                cluster.apply(life.manifest(namespace))
                life.applied_at = now
                active.append(life)
            snapshot = cluster.poll()
            assert snapshot is not None, "the API server stopped answering"
            duplicates = duplicate_workers(snapshot)
            for life in active:
                for problem in duplicates.get(life.name, []):
                    life.note(problem)
                # A lifecycle is moved on (finished, failed, deleted) only once the operator was killed
                # at least once during it: on a fast host jobs would otherwise end between two kills.
                move = next_move(life, snapshot, now, may_act=life.kills > 0)
                if isinstance(move, Finish):
                    cluster.finish(move.pods, move.code)
                elif isinstance(move, Delete):
                    cluster.delete(life.name)
                if not life.done and now - life.applied_at > LIFECYCLE_TIMEOUT:
                    life.note(
                        f"not finished after {LIFECYCLE_TIMEOUT:.0f} s; phases {life.phases_seen}; "
                        f"now {describe(snapshot, life.name)}"
                    )
                    life.done = True
            active = [life for life in active if not life.done]
            time.sleep(POLL_SECONDS)
        elapsed = time.monotonic() - started
        if operator.process is None or operator.process.poll() is not None:
            operator.start()
        # At rest: delete every job; the surviving operator removes everything they owned.
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false")
        try:
            cluster.until(lambda s: not remains(s), 30, "every job and object to be gone")
        except AssertionError as error:
            broken.append(f"{error}: {remains(cluster.snapshot)}")
        broken += cluster.problems  # overcommitted nodes (duplicates are noted per lifecycle)
    finally:
        operator.stop()
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    unfinished = [life.name for life in lives if not life.done]
    failed = {life.name: life.problems for life in lives if life.problems}
    survived = sum(1 for life in lives if life.done and not life.problems)
    kills = kills_at.pop("(kills)", 0)
    where = ", ".join(f"{phase} {count}" for phase, count in kills_at.most_common())
    record(
        area="fault",
        what=(
            f"operator SIGKILLed {kills} times at seeded-random moments (seed {SEED}: "
            f"{schedule.working[0]:g}-{schedule.working[1]:g} s after it was ready, or in its start-up "
            f"{schedule.startup_share:.0%} of the time) and restarted {schedule.down[0]:g}-"
            f"{schedule.down[1]:g} s later, across {LIFECYCLES} KWOK job lifecycles ({summary(lives)}), "
            f"{IN_FLIGHT} at a time; {sum(1 for life in lives if life.kills)} lifecycles saw at least "
            f"one kill; job phases at the kills: {where}"
        ),
        trials=LIFECYCLES,
        survived=survived,
        lost="nothing"
        if not failed and not broken and not unfinished
        else f"{len(failed)} lifecycles broke: {failed}; unfinished {unfinished}; cluster: {broken}",
        checks=(
            "at every poll no rank had two live pods and no node more GPUs in use than it has; each job "
            "ended in its expected phase (Succeeded, Failed, or deleted) with the expected "
            "status.restarts, only its last generation's pods left, everything owned by it; after all "
            "jobs were deleted no pod, Service or ConfigMap was left"
        ),
    )
    print(f"{LIFECYCLES} lifecycles and {kills} operator kills in {elapsed:.0f} s")
    hit = sum(1 for life in lives if life.kills)
    assert hit >= 0.8 * LIFECYCLES, f"only {hit} lifecycles saw the operator killed ({kills} kills)"
    assert not unfinished, f"lifecycles still running at the deadline: {unfinished}"
    assert not failed, failed
    assert not broken, broken
