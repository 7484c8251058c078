"""The cluster fails under a running operator: nodes are lost, the API server and etcd crash.

Everything happens on a test bed of this module's own. The operator process is started once per test
and never restarted: it has to ride out each fault by itself.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.operator.live import OperatorProcess
from tests.reliability.faults_bed import (
    FAKE_NODES,
    GPUS_PER_FAKE_NODE,
    crash,
    fake_node,
    kwok_job,
    start_again,
)
from tests.reliability.faults_cluster import (
    Cluster,
    Snapshot,
    describe,
    generation,
    remains,
    running,
    settled_problems,
    workers_by_node,
)

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(240)]

KWOK_ANNOTATION = "kwok.x-k8s.io/node"


@pytest.fixture
def bed(fault_bed: Testbed) -> Testbed:
    return fault_bed


@pytest.fixture
def cluster(bed: Testbed) -> Iterator[Cluster]:
    namespace = f"fault-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    try:
        yield Cluster(str(bed.kubeconfig), namespace)
    finally:
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture
def operator(bed: Testbed, tmp_path: Path) -> Iterator[OperatorProcess]:
    process = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=1.0)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        print(f"--- operator log ---\n{process.tail(80)}")


def alive(operator: OperatorProcess) -> bool:
    return operator.process is not None and operator.process.poll() is None


def finish_and_settle(cluster: Cluster, jobs: list[str]) -> list[str]:
    """End the jobs' workers, then check each job Succeeded with nothing stale left; problems found."""
    for job in jobs:
        cluster.finish_job(job, 0)
    snapshot = cluster.until(lambda s: all(s.phase(j) == "Succeeded" for j in jobs), 30, f"{jobs} to succeed")
    snapshot = cluster.until(
        lambda s: not any(settled_problems(s, j) for j in jobs), 15, "finished jobs to settle"
    )
    return [f"{j}: {p}" for j in jobs for p in settled_problems(snapshot, j)]


def delete_all(cluster: Cluster, bed: Testbed) -> None:
    bed.kubectl("delete", "htj", "--all", "-n", cluster.namespace, "--wait=false")
    cluster.until(lambda s: not remains(s), 30, "every job and object to be gone")


# --- nodes lost ------------------------------------------------------------------------------------


def make_not_ready(bed: Testbed, node: str) -> None:
    """What a node whose kubelet stopped looks like: KWOK lets go of it, and its Ready condition turns
    Unknown as the node lifecycle controller would set it."""
    bed.kubectl("annotate", "node", node, f"{KWOK_ANNOTATION}-")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    condition = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    patch = json.dumps({"status": {"conditions": [condition]}})
    bed.kubectl("patch", "node", node, "--subresource=status", "--type=merge", "-p", patch)


def replaced_elsewhere(snapshot: Snapshot, job: str, before: int, lost: str) -> bool:
    now = generation(snapshot, job)
    return (
        running(snapshot, job)
        and now is not None
        and now > before
        and lost not in workers_by_node(snapshot, job)
    )


def on_node(snapshot: Snapshot, node: str) -> list[str]:
    return [p["metadata"]["name"] for p in snapshot.pods if p["spec"].get("nodeName") == node]


def test_lost_nodes_requeue_their_jobs_onto_other_nodes(  # type: ignore[no-untyped-def]
    bed: Testbed, cluster: Cluster, operator: OperatorProcess, record
) -> None:
    jobs = ["lose-a", "lose-b", "lose-c"]
    for job in jobs:
        cluster.apply(kwok_job(job, cluster.namespace, gpus=4))
    snapshot = cluster.until(lambda s: running(s, *jobs), 40, f"{jobs} to run")
    trials: dict[str, list[str]] = {}
    lost_nodes = []
    for job, how in (("lose-a", "not ready, then deleted"), ("lose-b", "deleted")):
        node = sorted(workers_by_node(snapshot, job))[0]
        before = generation(snapshot, job)
        assert before is not None
        bystanders = {j: generation(snapshot, j) for j in jobs if node not in workers_by_node(snapshot, j)}
        problems: list[str] = []
        if how.startswith("not ready"):
            make_not_ready(bed, node)
        else:
            bed.kubectl("delete", "node", node, "--wait=false")
        try:
            snapshot = cluster.until(
                lambda s, j=job, g=before, n=node: replaced_elsewhere(s, j, g, n), 40, f"{job} re-placed"
            )
        except AssertionError as error:
            problems.append(str(error))
        if how.startswith("not ready"):
            bed.kubectl("delete", "node", node, "--wait=false")
            snapshot = cluster.until(lambda s, n=node: n not in s.node_gpus, 20, f"{node} to be deleted")
        if on_node(snapshot, node):
            problems.append(f"pods left on {node}: {on_node(snapshot, node)}")
        moved = {j: g for j, g in bystanders.items() if generation(snapshot, j) != g}
        if moved:
            problems.append(f"jobs not on {node} were restarted: {moved}")
        if not running(snapshot, job):
            problems.append(f"{job} is {snapshot.phase(job)}")
        trials[f"{job} on {node} ({how})"] = problems
        lost_nodes.append(node)
    try:
        settle = finish_and_settle(cluster, jobs)
        delete_all(cluster, bed)
    except AssertionError as error:
        settle = [str(error)]
    finally:
        for node in lost_nodes:  # the next tests get the full pool again
            bed.apply_nodes(fake_node(node))
    broken = [*cluster.problems, *settle]
    survived = sum(1 for problems in trials.values() if not problems) if not broken else 0
    record(
        area="fault",
        what=(
            "a KWOK node running a job lost while 3 jobs ran: once NotReady (KWOK let go of it, Ready "
            "Unknown) and then deleted, once deleted outright"
        ),
        trials=len(trials),
        survived=survived,
        lost="nothing" if survived == len(trials) else f"{trials}; {broken}",
        checks=(
            "the job on the lost node was queued and placed again as a new generation on other nodes "
            "and ran; no pod left on the lost node; jobs elsewhere kept their generation; no rank had "
            "two live pods, no node overcommitted; all jobs then Succeeded and were cleaned up"
        ),
    )
    assert all(not problems for problems in trials.values()), trials
    assert not broken, broken


# --- the control plane crashes -------------------------------------------------------------------


CONTROL_PLANE_CRASHES = (("etcd",), ("etcd", "kube-apiserver"))
DOWN_SECONDS = 2.0
JOB_GPUS = 8  # each job spans two fake nodes
SLOTS = FAKE_NODES * GPUS_PER_FAKE_NODE // JOB_GPUS  # jobs that fit on the fake GPUs at once


def steady(snapshot: Snapshot, jobs: list[str]) -> bool:
    """The pool is full: as many unfinished jobs run as fit; the rest wait."""
    phases = Counter(snapshot.phase(j) for j in jobs if snapshot.phase(j) != "Succeeded")
    unfinished = sum(phases.values())
    return (
        phases
        == Counter({"Running": min(SLOTS, unfinished), "Queued": max(0, unfinished - SLOTS)}) - Counter()
    )


def oldest_running(snapshot: Snapshot, jobs: list[str], count: int) -> list[str]:
    return [j for j in jobs if snapshot.phase(j) == "Running"][:count]


def test_api_server_and_etcd_crashes_are_ridden_out_without_an_operator_restart(  # type: ignore[no-untyped-def]
    bed: Testbed, cluster: Cluster, operator: OperatorProcess, record
) -> None:
    jobs = [f"cp-{i:02d}" for i in range(SLOTS + 1)]
    for job in jobs:
        cluster.apply(kwok_job(job, cluster.namespace, gpus=JOB_GPUS))
    cluster.until(lambda s: steady(s, jobs), 60, "the pool full and one job queued")
    pid = operator.process.pid if operator.process else None
    trials: dict[str, list[str]] = {}
    downtime: dict[str, float] = {}
    recovery: dict[str, float] = {}  # control plane back -> finished jobs seen, freed GPUs refilled
    nudged: dict[str, int] = {}  # pods KWOK was reminded of after the crash
    for index, components in enumerate(CONTROL_PLANE_CRASHES):
        name = " and ".join(components)
        problems: list[str] = []
        # Two jobs arrive and two finish right before the crash: the operator is validating,
        # finishing and placing jobs when the API goes away.
        for newcomer in (f"cp-{len(jobs):02d}", f"cp-{len(jobs) + 1:02d}"):
            cluster.apply(kwok_job(newcomer, cluster.namespace, gpus=JOB_GPUS))
            jobs.append(newcomer)
        done = oldest_running(cluster.snapshot, jobs, 2)
        for job in done:
            cluster.finish_job(job, 0)
        argvs = {component: crash(bed, component) for component in components}
        time.sleep(DOWN_SECONDS)
        came_back = sum(
            start_again(bed, component, argvs[component])
            for component in ("etcd", "kube-apiserver")
            if component in argvs
        )
        downtime[name] = DOWN_SECONDS + came_back
        back = time.monotonic()
        cluster.until(lambda s: True, 30, "the API to answer")
        nudged[name] = len(cluster.nudge_kwok())
        try:
            snapshot = cluster.until(
                lambda s, done=done: all(s.phase(j) == "Succeeded" for j in done) and steady(s, jobs),
                60,
                f"{done} to succeed and two queued jobs to run (trial {index})",
            )
            problems += [f"{j}: {p}" for j in done for p in settled_problems(snapshot, j)]
            recovery[name] = time.monotonic() - back
        except AssertionError as error:
            problems.append(f"{error}; finished: {[describe(cluster.snapshot, j) for j in done]}")
        if not alive(operator) or (operator.process and operator.process.pid != pid):
            problems.append("the operator process died")
        trials[name] = problems
    problems_at_end: list[str] = []
    try:
        while still_running := [j for j in jobs if cluster.snapshot.phase(j) == "Running"]:
            problems_at_end += finish_and_settle(cluster, still_running)
            cluster.until(lambda s: steady(s, jobs), 30, "the last queued jobs to run")
        phases = {j: cluster.snapshot.phase(j) for j in jobs}
        problems_at_end += [f"{j} is {phase}" for j, phase in phases.items() if phase != "Succeeded"]
        delete_all(cluster, bed)
    except AssertionError as error:
        problems_at_end.append(str(error))
    broken = [*cluster.problems, *problems_at_end]
    survived = sum(1 for problems in trials.values() if not problems) if not broken else 0
    print(
        f"control plane trials: {trials}; unavailable {downtime}; recovered after {recovery}; nudged {nudged}"
    )
    record(
        area="fault",
        what=(
            f"control plane SIGKILLed for {DOWN_SECONDS:.0f} s while {SLOTS} jobs of {JOB_GPUS} GPUs "
            "filled the pool and others queued, two just submitted and two just finishing: "
            + "; ".join(
                f"{name} (unavailable {seconds:.1f} s; KWOK reminded of {nudged.get(name, 0)} pod "
                "transitions it failed to write meanwhile)"
                for name, seconds in downtime.items()
            )
        ),
        trials=len(trials),
        survived=survived,
        lost="nothing" if survived == len(trials) else f"{trials}; {broken}",
        checks=(
            f"the same operator process (never restarted) saw the finished jobs Succeeded and filled "
            f"the freed GPUs with queued jobs; all {len(jobs)} jobs ran and Succeeded with "
            "nothing stale left; no rank had two live pods, no node overcommitted; everything cleaned "
            "up after deletion"
        ),
    )
    assert all(not problems for problems in trials.values()), trials
    assert not broken, broken
