"""Checkpoint first, live: a higher-priority job preempts a running torch job on the test bed; the
operator annotates the workers' pods, the workers see the annotation through their Downward API
volume, save at the next step boundary and exit; the preempted job later resumes from that step.
The preemption is heterotrain's own, or Kueue's (v0.19.2, running on the same bed) for jobs labelled
for a LocalQueue: Kueue evicts the low-priority Workload, and the operator drains it the same way.

The operator behaves as it does today: it annotates, waits up to its grace period (long here, so that
the workers' own exit is what ends the wait) and deletes the pods. What the job lost is measured
against independent records: the steps the first generation ran in the epoch (its own log) against
the steps the checkpoint's sampler position covers, counted with the sampler's step sizes.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.kueue.live import LOCAL_QUEUE, WORKLOADS, KueueQueue
from tests.operator.live import OperatorProcess, wait_for
from tests.reliability.faults_cluster import Cluster, generation, status
from tests.reliability.faults_training import digits_job, worker_run

from hetero_operator.controller import names
from hetero_operator.kueue import constants
from hetero_operator.kueue.admission import read_admission
from hetero_operator.plan import CHECKPOINT_REQUESTED_ANNOTATION, Plan
from hetero_operator.testbed import kueue
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import REPO_ROOT
from hetero_runtime.checkpoint import load
from hetero_runtime.sampler import step_sizes

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.timeout(600)]

GRACE_SECONDS = 60.0
KUEUE_QUOTA = {"fast": 1, "medium": 1, "slow": 1}  # the three process nodes: room for one job
PASSES = 12  # `low` makes 12 passes over 1437 samples an epoch: epochs of several seconds
DATASET = 1437 * PASSES
STOPPED = re.compile(r"stopping on request \((.+?)\) at epoch (\d+) after (\d+) samples of it \((\d+) steps")
RESUMED = re.compile(r"resuming from \S*-sample-(\d+)\.pt \((\d+) epochs done\), (\d+) samples into epoch")


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """The demo's three process nodes, with Kueue running: unlabelled jobs must behave as without it."""
    testbed = Testbed(tmp_path_factory.mktemp("preemption-bed"))
    try:
        testbed.up(load_node_list(REPO_ROOT / "tests" / "e2e" / "nodes.yaml"))
        testbed.kubectl("apply", "-f", str(REPO_ROOT / "examples" / "gpuclasses.yaml"))
        kueue.start(testbed)
        yield testbed
    finally:
        testbed.down()


def steps_to_reach(consumed: int, plan: Plan) -> int:
    """Global steps of an epoch that consume `consumed` samples under `plan`, by the sampler's sizes."""
    total = steps = 0
    for sizes in step_sizes(DATASET, 0, plan.local_batches):
        if total >= consumed:
            break
        total += sum(sizes)
        steps += 1
    assert total == consumed, f"{consumed} samples is not a step boundary of {plan.local_batches}"
    return steps


def stop_record(log: str) -> tuple[str, int, int, int]:
    """(why, epoch, samples consumed, steps run) from a worker's stop line."""
    found = STOPPED.search(log)
    assert found is not None, f"no stop line in the worker's log: {log[-2000:]}"
    return found.group(1), int(found.group(2)), int(found.group(3)), int(found.group(4))


def preempt_mid_epoch(
    bed: Testbed, cluster: Cluster, namespace: str, labels: dict[str, str]
) -> dict[str, Any]:
    """Start `low`, let it finish an epoch and get into the next, then start `urgent` (priority 10);
    both carry `labels`."""
    low = digits_job("low", namespace, epochs=4)
    low["metadata"]["labels"] = labels
    low["spec"]["checkpoint"]["everyEpochs"] = 100  # only the requested checkpoint is taken mid-run
    # Long epochs, so that the preemption lands inside the second one on a fast host too.
    low["spec"]["env"] = [
        *[e for e in low["spec"]["env"] if e["name"] != "DIGITS_PASSES_PER_EPOCH"],
        {"name": "DIGITS_PASSES_PER_EPOCH", "value": str(PASSES)},
    ]
    cluster.apply(low)
    cluster.until(lambda s: s.phase("low") == "Running", 120, "low to run")
    rank0 = wait_for(lambda: worker_run(bed, namespace, "low", 0, 0), 30, "low's rank 0")
    wait_for(rank0.progress, 180, "low's first epoch to end")
    time.sleep(2.0)  # a few steps into the second epoch (4x the first's samples of digits_job)
    urgent = digits_job("urgent", namespace, epochs=1)
    urgent["metadata"]["labels"] = labels
    urgent["spec"]["priority"] = 10
    cluster.apply(urgent)
    started = time.monotonic()
    asked = cluster.until(
        lambda s: (
            all(
                CHECKPOINT_REQUESTED_ANNOTATION in (p["metadata"].get("annotations") or {})
                for p in s.job_pods("low")
            )
            and s.job_pods("low")
        ),
        60,
        "low's workers to be asked for a checkpoint",
    )
    draining = next(c for c in status(asked.jobs["low"]).get("conditions") or [] if c["type"] == "Draining")
    cluster.until(lambda s: s.phase("urgent") == "Running", 120, "urgent to run in low's place")
    return {"draining": draining, "drained_seconds": time.monotonic() - started, "rank0": rank0}


def run_both(
    bed: Testbed, namespace: str, operator: OperatorProcess, labels: dict[str, str]
) -> dict[str, Any]:
    """`low` preempted by `urgent`; both run to their end. What was seen, and low's last generation."""
    cluster = Cluster(str(bed.kubeconfig), namespace)
    operator.start()
    try:
        seen = preempt_mid_epoch(bed, cluster, namespace, labels)
        cluster.until(lambda s: s.phase("urgent") == "Succeeded", 240, "urgent to finish")
        final = cluster.until(lambda s: s.phase("low") in ("Succeeded", "Failed"), 300, "low to finish")
        assert final.phase("low") == "Succeeded"
        return {**seen, "generation": generation(final, "low") or 0}
    finally:
        bed.kubectl("delete", "htj", "--all", "-n", namespace, "--wait=false", check=False)
        operator.stop()


def check_resumed_losing_at_most_one_step(bed: Testbed, namespace: str, seen: dict[str, Any]) -> None:
    # The workers' exit ended the drain, not the operator's timer.
    assert seen["drained_seconds"] < GRACE_SECONDS, seen
    runs = [worker_run(bed, namespace, "low", 0, rank) for rank in range(3)]
    stops = [stop_record(run.log) for run in runs if run is not None]
    assert len(stops) == 3, "every first-generation worker logged its stop"
    assert any(CHECKPOINT_REQUESTED_ANNOTATION in why for why, _, _, _ in stops)
    assert len({(epoch, consumed) for _, epoch, consumed, _ in stops}) == 1, "all stopped at one step"
    _, epoch, consumed, ran = stops[0]
    assert epoch == 1 and 0 < consumed < DATASET, "the stop landed inside the second epoch"
    claim = bed.root / "local-pods" / "claims" / namespace / names.checkpoint_claim_name("low")
    checkpoint = claim / f"checkpoint-epoch-{epoch:06d}-sample-{consumed:09d}.pt"
    state = load(checkpoint)
    assert state["position"] == {"epoch": epoch, "consumed": consumed}
    covered = steps_to_reach(consumed, Plan.from_json(state["plan"]))
    print(f"stopped at epoch {epoch} after {ran} steps; the checkpoint covers {covered} steps")
    assert 0 <= ran - covered <= 1, f"lost {ran - covered} steps"
    # The preemption came after several steps of the epoch: a resume from its start would lose them.
    assert ran >= 2
    new_rank0 = worker_run(bed, namespace, "low", seen["generation"], 0)
    assert new_rank0 is not None
    resumed = RESUMED.search(new_rank0.log)
    assert resumed is not None and int(resumed.group(1)) == consumed and int(resumed.group(2)) == epoch
    assert [line["epoch"] for line in new_rank0.progress()] == [2, 3, 4]


def test_a_preempted_torch_job_resumes_losing_at_most_one_step(bed: Testbed, tmp_path: Path) -> None:
    namespace = f"preempt-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=GRACE_SECONDS)
    seen = run_both(bed, namespace, operator, labels={})
    assert seen["draining"]["reason"] == "Preempted"
    check_resumed_losing_at_most_one_step(bed, namespace, seen)


def test_a_torch_job_kueue_preempts_resumes_losing_at_most_one_step(bed: Testbed, tmp_path: Path) -> None:
    """Both jobs queue in a LocalQueue whose quota holds one of them; Kueue evicts `low`'s Workload
    for `urgent`'s, the operator drains `low` with a checkpoint and hands the admission back, and
    once `urgent` is done Kueue admits `low` again on its same Workload."""
    namespace = f"kpreempt-{uuid.uuid4().hex[:6]}"
    bed.kubectl("create", "namespace", namespace)
    queue = KueueQueue(bed, namespace, KUEUE_QUOTA)
    args = ("--kueue.enabled", "--kueue.repropose-after-seconds", "600")
    operator = OperatorProcess(bed, tmp_path / "operator.log", grace_seconds=GRACE_SECONDS, extra_args=args)
    seen = run_both(bed, namespace, operator, labels={constants.QUEUE_NAME_LABEL: LOCAL_QUEUE})
    assert seen["draining"]["reason"] == "Evicted" and "Preempted" in seen["draining"]["message"]
    check_resumed_losing_at_most_one_step(bed, namespace, seen)
    workloads = json.loads(
        bed.kubectl("get", WORKLOADS, "-n", namespace, "-l", f"{names.LABEL_JOB}=low", "-o", "json").stdout
    )["items"]
    assert len(workloads) == 1, "low queued again on its one Workload"
    finished = read_admission(workloads[0]).finish
    assert finished is not None and finished.succeeded
    # Kueue's own count of the quota in use lags the Workloads by a moment.
    wait_for(lambda: queue.usage() == {"fast": 0, "medium": 0, "slow": 0}, 60, "both jobs' quota handed back")
