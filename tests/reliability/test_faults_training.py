"""Faults under a real training job: a worker process killed in the middle of an epoch, and
Prometheus stopped and started again while the operator rebalances the job.

The digits example runs as three torch processes over gloo on the test bed's local process nodes,
checkpointing every epoch. Both faults hit the same run (one torch start-up less), each with its own
ledger row and its own checks.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.operator.live import OperatorProcess, wait_for
from tests.reliability.faults_cluster import Cluster, Snapshot, generation, status, workers_by_node
from tests.reliability.faults_training import (
    KillSeen,
    OutageSeen,
    WorkerRun,
    checkpoints,
    digits_job,
    kill_problems,
    outage_problems,
    share,
    worker_run,
)

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(360)]

JOB = "digits"
# Epochs enough for the job to outlive the outage by many seconds: a restarted Prometheus passes on
# the pods it discovers only after about 5 s and then has to scrape each one before the rebalancer sees
# every rank again. An epoch takes about a second on a fast host and the outage alone lasts 8 s; with
# 12 epochs a run ended 3 epochs after the restart, before the restarted rank 0 had ever been scraped.
EPOCHS = 30
KILLED_RANK = 1
KILL_INTO_EPOCH = 0.2  # of the last epoch's length: the kill lands early in the next epoch
METRICS = "MetricsAvailable"
MIN_OUTAGE_SECONDS = 8.0  # four rebalancer passes
# The node slowed during the outage (the test bed's simulated slowdown, a noisy neighbour): the fastest,
# so that its worker's share must shrink once the rebalancer measures again.
SLOWED_NODE = "local-fast"
SLOWDOWN = "4"
SLOWDOWN_ANNOTATION = "testbed.heterotrain.io/slowdown"
NEW_PLAN_TIMEOUT = 90.0


@pytest.fixture
def bed(fault_bed: Testbed) -> Testbed:
    return fault_bed


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status(job).get("conditions") or [] if c["type"] == kind), {})


def test_worker_killed_mid_epoch_and_prometheus_outage(  # type: ignore[no-untyped-def]
    bed: Testbed, record, tmp_path: Path
) -> None:
    namespace = f"train-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    cluster = Cluster(str(bed.kubeconfig), namespace)
    operator = OperatorProcess(
        bed, tmp_path / "operator.log", grace_seconds=1.0, extra_args=("--prometheus-url", bed.prometheus_url)
    )
    kill, outage = KillSeen(), OutageSeen()
    errors: list[str] = []  # a step that timed out
    operator.start()
    pid = operator.process.pid if operator.process else None
    try:
        cluster.apply(digits_job(JOB, namespace, EPOCHS))
        cluster.until(lambda s: s.phase(JOB) == "Running", 90, "the job to run")
        kill_a_worker_mid_epoch(bed, cluster, kill)
        try:
            stop_prometheus_for_an_epoch(bed, cluster, outage)
        finally:
            bed.kubectl("annotate", "node", SLOWED_NODE, f"{SLOWDOWN_ANNOTATION}-", check=False)
        final = cluster.until(lambda s: s.phase(JOB) in ("Succeeded", "Failed"), 240, "the job to end")
        kill.final_phase = final.phase(JOB)
        last = worker_run(bed, namespace, JOB, generation(final, JOB) or 0, 0)
        kill.final_epochs = [line["epoch"] for line in last.progress()] if last else []
    except AssertionError as error:
        errors.append(str(error))
    finally:
        outage.operator_survived = operator.process is not None and operator.process.poll() is None
        outage.operator_survived &= operator.process is not None and operator.process.pid == pid
        outage.logged = f"Prometheus at {bed.prometheus_url} is unreachable" in operator.log.read_text()
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        wait_for(lambda: cluster.poll() and not cluster.snapshot.pods, 60, "the workers to stop")
        operator.stop()
        bed.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    print(f"kill: {kill}\noutage: {outage}")

    killed = [*kill_problems(kill, EPOCHS), *errors]
    record(
        area="fault",
        what=(
            f"a worker process (rank {KILLED_RANK} of 3, real torch over gloo) SIGKILLed mid-epoch "
            f"{kill.epochs_done + 1} of {EPOCHS}; checkpoints every epoch"
        ),
        trials=1,
        survived=0 if killed else 1,
        lost="nothing: only the unfinished epoch was trained again" if not killed else "; ".join(killed),
        checks=(
            "the job restarted once (status.restarts 1); the new rank 0 resumed from the newest "
            "checkpoint, which held every finished epoch; the restarted workers trained exactly the "
            "remaining epochs and the job Succeeded"
        ),
    )
    down = [*outage_problems(outage), *errors]
    recovered = float("nan") if outage.recovered_seconds is None else outage.recovered_seconds
    replanned = float("nan") if outage.new_plan_seconds is None else outage.new_plan_seconds
    record(
        area="fault",
        what=(
            f"Prometheus stopped for {outage.down_seconds:.0f} s (a whole epoch, several rebalancer passes) "
            "and started again while the operator rebalanced a running torch job; meanwhile the node of "
            f"rank {outage.slowed_rank} ({SLOWED_NODE}) was slowed {SLOWDOWN}x (the test bed's "
            f"{SLOWDOWN_ANNOTATION} annotation), so a new split was due; a new plan (version "
            f"{outage.new_plan}) that shrank its share was written {replanned:.1f} s after Prometheus "
            f"answered again (the first new plan after it: {_first(outage)})"
        ),
        trials=1,
        survived=0 if down else 1,
        lost="nothing" if not down else "; ".join(down),
        checks=(
            "MetricsAvailable=False (PrometheusUnavailable) and the outage in the operator's log; no plan "
            "written and no rebalance recorded without metrics; the job kept Running on its plan; "
            "MetricsAvailable=True again once Prometheus was back (after "
            f"{recovered:.1f} s); once measurements returned a new plan was written within "
            f"{NEW_PLAN_TIMEOUT:.0f} s and gave the slowed rank a smaller share of the batch (here "
            f"{_percent(outage.share_before)} -> {_percent(outage.share_after)}); the same operator "
            "process throughout"
        ),
    )
    assert not killed, killed
    assert not down, down


def _first(seen: OutageSeen) -> str:
    if seen.first_plan is None:
        return "none"
    return f"version {seen.first_plan[0]} after {seen.first_plan[1]:.1f} s"


def _percent(value: float | None) -> str:
    return "none" if value is None else f"{value:.0%}"


def kill_a_worker_mid_epoch(bed: Testbed, cluster: Cluster, seen: KillSeen) -> None:
    namespace = cluster.namespace
    rank0 = wait_for(lambda: worker_run(bed, namespace, JOB, 0, 0), 30, "rank 0's process")
    victim = wait_for(lambda: worker_run(bed, namespace, JOB, 0, KILLED_RANK), 30, "the victim's process")
    victim_pid = wait_for(lambda: victim.pid, 30, "the victim's process id")
    # Epochs last about a second here, and a balanced split makes the next one shorter still: the kill
    # goes in early in the next epoch, after a short fraction of the last one's length, polled closely.
    finished = wait_for(rank0.progress, 120, "the first epoch to end", interval=0.02)
    time.sleep(KILL_INTO_EPOCH * float(finished[-1]["wall_seconds"]))
    seen.checkpoints = checkpoints(bed, namespace, JOB)
    os.kill(victim_pid, signal.SIGKILL)
    seen.mid_epoch = len(rank0.progress()) == len(finished)
    seen.epochs_done = finished[-1]["epoch"]
    restarted = cluster.until(
        lambda s: s.phase(JOB) == "Running" and (generation(s, JOB) or 0) >= 1, 120, "the job to run again"
    )
    seen.restarts = int(status(restarted.jobs[JOB]).get("restarts") or 0)
    seen.generation_0_epochs = [line["epoch"] for line in rank0.progress()]
    new_rank0 = wait_for(lambda: worker_run(bed, namespace, JOB, 1, 0), 30, "the new rank 0")
    seen.resumed = wait_for(new_rank0.resumed, 90, "the new rank 0 to resume from a checkpoint")


def split_settled(cluster: Cluster, rank0: WorkerRun) -> bool:
    """The rebalancer has moved the job off its first, even split (its last rebalance wrote the
    current plan) and the last two epochs ran on that plan: a later speed change is then the node's,
    not the split's. Two epochs on a plan alone are not enough: after the restart the rebalancer may
    not have measured the new workers yet, and then it rebalances only after the outage, from what
    it measured before the node slowed."""
    snapshot = cluster.poll()
    job = status(snapshot.jobs[JOB]) if snapshot is not None else {}
    plan = job.get("plan") or {}
    records = job.get("rebalances") or []
    if not records or records[-1].get("toVersion") != plan.get("version"):
        return False
    lines = rank0.progress()
    return len(lines) >= 2 and all(line.get("plan_version") == plan.get("version") for line in lines[-2:])


def stop_prometheus_for_an_epoch(bed: Testbed, cluster: Cluster, seen: OutageSeen) -> None:
    """Stop Prometheus once the restarted job's split has settled, slow one node meanwhile, start
    Prometheus again an epoch later, and wait for the new split the slowed node calls for."""
    snapshot = cluster.snapshot
    rank0 = worker_run(bed, cluster.namespace, JOB, generation(snapshot, JOB) or 0, 0)
    assert rank0 is not None
    wait_for(lambda: split_settled(cluster, rank0), 120, "two epochs on a rebalanced plan after the restart")
    placed = cluster.until(lambda s: True, 5, "a snapshot")
    before = status(placed.jobs[JOB])
    bed.stop_component("prometheus")
    stopped = time.monotonic()
    seen.slowed_rank = workers_by_node(placed, JOB)[SLOWED_NODE][0]
    bed.kubectl("annotate", "node", SLOWED_NODE, f"{SLOWDOWN_ANNOTATION}={SLOWDOWN}", "--overwrite")
    try:
        during = cluster.until(
            lambda s: condition(s.jobs[JOB], METRICS).get("reason") == "PrometheusUnavailable",
            30,
            "MetricsAvailable=False (PrometheusUnavailable)",
        )
        seen.condition_during = condition(during.jobs[JOB], METRICS)
        # A whole epoch and several rebalancer passes without metrics: with them, it would have
        # measured the epoch and decided by now.
        epochs = len(rank0.progress())
        wait_for(lambda: len(rank0.progress()) > epochs, 60, "an epoch during the outage")
        time.sleep(max(0.0, stopped + MIN_OUTAGE_SECONDS - time.monotonic()))
        after = status(cluster.until(lambda s: True, 5, "a snapshot").jobs[JOB])
        seen.phase_during = after.get("phase")
        seen.plans = ((before.get("plan") or {}).get("version"), (after.get("plan") or {}).get("version"))
        seen.rebalances = (len(before.get("rebalances") or []), len(after.get("rebalances") or []))
    finally:
        bed.start_component("prometheus")  # returns once Prometheus answers (/-/ready)
        seen.down_seconds = time.monotonic() - stopped
        started = time.monotonic()
        seen.epoch_at_restart = max((line["epoch"] for line in rank0.progress()), default=None)
    back = cluster.until(
        lambda s: condition(s.jobs[JOB], METRICS).get("status") == "True" or s.phase(JOB) != "Running",
        90,
        "MetricsAvailable=True again",
    )
    seen.condition_after = condition(back.jobs[JOB], METRICS)
    if seen.condition_after.get("status") == "True":
        seen.recovered_seconds = time.monotonic() - started
    outage_plan = after.get("plan") or {}
    rank = seen.slowed_rank
    seen.share_before = share(outage_plan, rank)

    def replanned(snapshot: Snapshot) -> bool:
        """A new plan that answers the slowed node (a first one may still be a decision on what was
        measured before the outage), or the job no longer running."""
        plan = status(snapshot.jobs[JOB]).get("plan") or {}
        newer = plan.get("version", 0) > outage_plan.get("version", 0)
        if newer and seen.first_plan is None:
            seen.first_plan = (plan["version"], time.monotonic() - started)
        shrunk = (share(plan, rank) or 1.0) < (seen.share_before or 0.0)
        return (newer and shrunk) or snapshot.phase(JOB) != "Running"

    try:
        written = cluster.until(replanned, NEW_PLAN_TIMEOUT, "a new plan once measurements returned")
    except AssertionError:
        return  # no new plan: outage_problems names it, and the worker kill's checks go on
    plan = status(written.jobs[JOB]).get("plan") or {}
    if plan.get("version", 0) > outage_plan.get("version", 0):
        seen.new_plan_seconds = time.monotonic() - started
        seen.new_plan = plan["version"]
        seen.share_after = share(plan, seen.slowed_rank)
