"""The operator with `--kueue` against the real Kueue v0.19.2 on the test bed: HeteroTrainJobs
labelled for a LocalQueue get a Workload per proposed mix, start only once admitted, on exactly the
admitted flavors and counts, and hand the quota back when evicted, finished or deleted.

The KWOK workers do not train: a preemption is shown by the checkpoint request on the workers, the
admission handed back, and the job placed again on a new worker generation. That a job Kueue preempts
resumes with real training, losing at most one step, is `tests/e2e/test_preemption_resume.py`.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from tests.kueue.conftest import GRACE_SECONDS
from tests.kueue.live import GPU, WORKLOADS, KueueQueue
from tests.operator.live import Jobs, OperatorProcess, wait_for

from hetero_operator.controller import names
from hetero_operator.kueue import constants
from hetero_operator.kueue.admission import WorkloadAdmission, WorkloadPhase, read_admission
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import GPU_CLASS_LABEL

pytestmark = pytest.mark.testbed

REACTS = 60.0  # seconds for Kueue and the operator to answer; each takes one or two here


def queued(jobs: Jobs, name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    manifest = jobs.manifest(name, gpus, **spec)
    manifest["metadata"]["labels"] = {constants.QUEUE_NAME_LABEL: "team"}
    return manifest


def workloads(jobs: Jobs, job: str) -> list[dict[str, Any]]:
    out = jobs.kubectl("get", WORKLOADS, "-l", f"{names.LABEL_JOB}={job}", "-o", "json")
    return list(json.loads(out)["items"])


def only_workload(jobs: Jobs, job: str) -> dict[str, Any] | None:
    found = workloads(jobs, job)
    return found[0] if len(found) == 1 else None


def admission(jobs: Jobs, job: str) -> WorkloadAdmission | None:
    found = only_workload(jobs, job)
    return read_admission(found) if found is not None else None


def phase_of(jobs: Jobs, job: str) -> WorkloadPhase | None:
    found = admission(jobs, job)
    return found.phase if found is not None else None


def node_classes(bed: Testbed) -> dict[str, str]:
    nodes = json.loads(bed.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(GPU_CLASS_LABEL, "") for n in nodes}


def pods_per_class(bed: Testbed, pods: list[dict[str, Any]]) -> Counter[str]:
    classes = node_classes(bed)
    return Counter(classes[p["spec"]["nodeName"]] for p in pods)


def running(jobs: Jobs, job: str, count: int) -> list[dict[str, Any]] | None:
    pods = jobs.running_pods(job)
    return pods if len(pods) == count and jobs.phase(job) == "Running" else None


def holder_and_waiter(jobs: Jobs, holder: int, waiter: str, gpus: int) -> None:
    """A job "holder" running on `holder` GPUs, and `waiter` submitted and waiting for its quota."""
    jobs.apply(queued(jobs, "holder", holder))
    wait_for(lambda: running(jobs, "holder", holder), REACTS, "the holder running")
    jobs.apply(queued(jobs, waiter, gpus))
    wait_for(lambda: phase_of(jobs, waiter) is WorkloadPhase.PENDING, REACTS, f"{waiter}'s Workload pending")


def test_a_job_runs_on_the_admitted_flavors_and_a_second_waits_until_the_first_finishes(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, {"fast": 2, "slow": 4})
    kueue_jobs.apply(queued(kueue_jobs, "first", 3))
    admitted = wait_for(
        lambda: (a := admission(kueue_jobs, "first")) is not None and a.phase is WorkloadPhase.ADMITTED and a,
        REACTS,
        "the first job's Workload admitted",
    )
    # The fastest GPUs the quota admits: both fast ones, then one slow; each on its own flavor.
    assert {(p.name, p.flavor(GPU), p.count) for p in admitted.pod_sets} == {
        ("fast", "fast", 2),
        ("slow", "slow", 1),
    }
    pods = wait_for(lambda: running(kueue_jobs, "first", 3), REACTS, "the first job running")
    assert pods_per_class(kueue_testbed, pods) == Counter({"fast": 2, "slow": 1})
    assert wait_for(lambda: queue.usage() == {"fast": 2, "slow": 1}, REACTS, "Kueue counting the first")

    kueue_jobs.apply(queued(kueue_jobs, "second", 2, gpuClasses=["fast"]))
    waiting = wait_for(
        lambda: (c := kueue_jobs.condition("second", "Admitted")) and c["reason"] == "Pending" and c,
        REACTS,
        "the second job's Workload pending",
    )
    assert "fast: 2 GPUs" in waiting["message"] and "insufficient unused quota" in waiting["message"]
    assert kueue_jobs.phase("second") == "Queued" and kueue_jobs.pods("second") == []

    kueue_jobs.finish(pods, exit_code=0)
    kueue_jobs.wait_phase("first", "Succeeded", REACTS)
    finished = wait_for(lambda: admission(kueue_jobs, "first"), REACTS, "the first Workload")
    assert finished.finish is not None and finished.finish.succeeded
    second = wait_for(lambda: running(kueue_jobs, "second", 2), REACTS, "the second job running")
    assert pods_per_class(kueue_testbed, second) == Counter({"fast": 2})
    assert wait_for(lambda: queue.usage() == {"fast": 2, "slow": 0}, REACTS, "Kueue counting the second")


def test_a_preempted_job_checkpoints_hands_its_quota_back_and_resumes_when_readmitted(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, {"fast": 4})
    kueue_jobs.apply(queued(kueue_jobs, "low", 4, priority=0))
    low_pods = wait_for(lambda: running(kueue_jobs, "low", 4), REACTS, "the low-priority job running")
    low_workload = only_workload(kueue_jobs, "low")
    assert low_workload is not None
    wait_for(lambda: queue.usage() == {"fast": 4}, REACTS, "Kueue counting the low-priority job")

    kueue_jobs.apply(queued(kueue_jobs, "high", 2, priority=10))
    # Kueue evicts the low-priority Workload; its workers are asked to save a checkpoint first.
    # The operator annotates the pods one request each: wait until every one of them is, not the first.
    workers = {p["metadata"]["name"] for p in low_pods}
    annotated = wait_for(
        lambda: (
            (
                named := {
                    p["metadata"]["name"]
                    for p in kueue_jobs.pods("low")
                    if names.CHECKPOINT_REQUESTED_ANNOTATION in p["metadata"].get("annotations", {})
                }
            )
            >= workers
            and named
        ),
        REACTS,
        "every low-priority worker asked for a checkpoint",
    )
    assert annotated == workers
    draining = kueue_jobs.condition("low", "Draining")
    assert draining is not None and draining["reason"] == "Evicted" and "Preempted" in draining["message"]
    # The quota stays counted while they save; then they stop and the admission is handed back.
    high_pods = wait_for(
        lambda: running(kueue_jobs, "high", 2), REACTS + GRACE_SECONDS, "the high-priority job running"
    )
    assert pods_per_class(kueue_testbed, high_pods) == Counter({"fast": 2})
    released = wait_for(
        lambda: (w := only_workload(kueue_jobs, "low")) and "admission" not in w.get("status", {}) and w,
        REACTS,
        "the low-priority admission handed back",
    )
    conditions = {c["type"]: c for c in released["status"]["conditions"]}
    assert (conditions["Requeued"]["status"], conditions["Requeued"]["reason"]) == ("True", "Preempted")
    assert released["metadata"]["name"] == low_workload["metadata"]["name"], "the same Workload queues again"
    assert kueue_jobs.phase("low") == "Queued" and not kueue_jobs.running_pods("low")

    # The preemptor finishes: the evicted job is admitted again and resumes on a new generation.
    kueue_jobs.finish(high_pods, exit_code=0)
    resumed = wait_for(lambda: running(kueue_jobs, "low", 4), REACTS, "the low-priority job resumed")
    assert {p["metadata"]["labels"][names.LABEL_GENERATION] for p in resumed} == {"1"}
    assert pods_per_class(kueue_testbed, resumed) == Counter({"fast": 4})
    assert kueue_jobs.status("low").get("restarts", 0) == 0, "an eviction is no failure"


def test_deleting_a_job_releases_its_quota(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, {"medium": 3})
    holder_and_waiter(kueue_jobs, 3, "waiter", 2)
    kueue_jobs.kubectl("delete", "htj", "holder", "--wait=false")
    wait_for(lambda: not workloads(kueue_jobs, "holder"), REACTS, "the holder's Workload deleted")
    waiter = wait_for(lambda: running(kueue_jobs, "waiter", 2), REACTS, "the waiter running")
    assert pods_per_class(kueue_testbed, waiter) == Counter({"medium": 2})
    assert wait_for(lambda: queue.usage() == {"medium": 2}, REACTS, "Kueue counting the waiter alone")


def test_an_operator_restarted_during_admission_leaves_no_duplicate_workload_or_pod(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    """Kueue admits a job's Workload while the operator is down; the restarted operator places it
    once, and a job whose Workload went meanwhile is stopped and submitted again, once."""
    KueueQueue(kueue_testbed, kueue_namespace, {"fast": 3})
    holder_and_waiter(kueue_jobs, 3, "train", 3)
    proposed = only_workload(kueue_jobs, "train")
    holder = only_workload(kueue_jobs, "holder")
    assert proposed is not None and holder is not None
    kueue_operator.kill()
    try:
        # The holder's quota goes (its Workload deleted by hand): Kueue admits train meanwhile.
        kueue_jobs.kubectl("delete", WORKLOADS, holder["metadata"]["name"])
        wait_for(lambda: phase_of(kueue_jobs, "train") is WorkloadPhase.ADMITTED, REACTS, "train admitted")
        assert kueue_jobs.pods("train") == [], "nobody places it while the operator is down"
    finally:
        kueue_operator.start()
    pods = wait_for(lambda: running(kueue_jobs, "train", 3), REACTS, "train running after the restart")
    names_ = sorted(p["metadata"]["name"] for p in kueue_jobs.pods("train"))
    assert (
        names_ == sorted(p["metadata"]["name"] for p in pods) == ["train-g0-w0", "train-g0-w1", "train-g0-w2"]
    )
    assert [w["metadata"]["name"] for w in workloads(kueue_jobs, "train")] == [proposed["metadata"]["name"]]
    # The holder runs without an admission: it is stopped (checkpoint first) and asks again, once.
    kueue_jobs.wait_phase("holder", "Queued", REACTS + GRACE_SECONDS)
    wait_for(lambda: phase_of(kueue_jobs, "holder") is WorkloadPhase.PENDING, REACTS, "the holder pending")
    assert len(workloads(kueue_jobs, "holder")) == 1
    wait_for(lambda: not kueue_jobs.running_pods("holder"), REACTS, "the holder's workers gone")


def test_suspending_a_job_deactivates_its_workload_and_resuming_admits_it_again(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, {"slow": 2})
    kueue_jobs.apply(queued(kueue_jobs, "train", 2))
    wait_for(lambda: running(kueue_jobs, "train", 2), REACTS, "the job running")
    kueue_jobs.kubectl("patch", "htj", "train", "--type=merge", "-p", '{"spec":{"suspend":true}}')
    kueue_jobs.wait_phase("train", "Suspended", REACTS + GRACE_SECONDS)
    wait_for(lambda: phase_of(kueue_jobs, "train") is WorkloadPhase.INACTIVE, REACTS, "the Workload inactive")
    wait_for(lambda: queue.usage() == {"slow": 0}, REACTS, "the quota released")
    assert only_workload(kueue_jobs, "train") is not None and kueue_jobs.pods("train") == []
    kueue_jobs.kubectl("patch", "htj", "train", "--type=merge", "-p", '{"spec":{"suspend":false}}')
    resumed = wait_for(lambda: running(kueue_jobs, "train", 2), REACTS, "the job running again")
    assert {p["metadata"]["labels"][names.LABEL_GENERATION] for p in resumed} == {"1"}


def test_a_job_whose_classes_the_queue_does_not_offer_says_which(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, {"fast": 4})
    kueue_jobs.apply(queued(kueue_jobs, "elsewhere", 1, gpuClasses=["medium", "slow"]))
    condition = wait_for(
        lambda: kueue_jobs.condition("elsewhere", "Admitted"), REACTS, "the job's Admitted condition"
    )
    assert (condition["status"], condition["reason"]) == ("False", "ClassesNotOffered")
    assert f"ClusterQueue {queue.cluster_queue} (LocalQueue team)" in condition["message"]
    assert "GPU classes medium, slow" in condition["message"]
    assert workloads(kueue_jobs, "elsewhere") == [] and kueue_jobs.phase("elsewhere") == "Queued"
