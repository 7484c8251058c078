"""The quota a ClusterQueue has per GPU class, and the mix a job proposes within it (pure)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from hetero_operator.controller.facts import ClassFacts
from hetero_operator.kueue import queues
from hetero_operator.kueue.facts import PROPOSED_AT_ANNOTATION, ClusterQueueFacts, FlavorFacts, WorkloadFacts
from hetero_operator.kueue.proposal import propose
from hetero_operator.kueue.quota import class_quotas, fits, flavor_fits
from hetero_operator.kueue.status_patch import WorkloadChange, due_patch
from hetero_operator.scheduler import GPUClassInfo, JobRequest, NodeInfo, Snapshot

PRODUCT = "nvidia.com/gpu.product"
GPU = "nvidia.com/gpu"
FAST = ClassFacts("fast", {PRODUCT: "A100"}, GPU, 1.0, 80, 4)
SLOW = ClassFacts("slow", {PRODUCT: "T4"}, GPU, 0.25, 16, 1)
FLAVORS = {
    "fast": FlavorFacts("fast", {PRODUCT: "A100"}),
    "slow": FlavorFacts("slow", {PRODUCT: "T4"}),
    "any": FlavorFacts("any", {}),
}


def cluster_queue(quotas: dict[str, int], usage: dict[str, int] | None = None) -> ClusterQueueFacts:
    body = queues.cluster_queue("gpus", GPU, quotas)
    used = [{"name": f, "resources": [{"name": GPU, "total": str(n)}]} for f, n in (usage or {}).items()]
    body["status"] = {"flavorsUsage": used}
    return ClusterQueueFacts.from_body(body)


# --- quota per class --------------------------------------------------------------------------------


def test_each_class_gets_the_flavor_whose_labels_are_its_selector() -> None:
    quotas = class_quotas(cluster_queue({"slow": 8, "fast": 2}, {"fast": 1}), FLAVORS, [FAST, SLOW])
    assert {c: (q.flavor, q.nominal, q.used, q.unused) for c, q in quotas.items()} == {
        "fast": ("fast", 2, 1, 1),
        "slow": ("slow", 8, 0, 8),
    }


def test_a_class_without_a_fitting_flavor_gets_no_quota() -> None:
    assert set(class_quotas(cluster_queue({"fast": 4}), FLAVORS, [FAST, SLOW])) == {"fast"}


def test_a_flavor_that_fits_several_classes_counts_for_the_fastest_only() -> None:
    # "any" has no node labels: with no label key in its group, Kueue fits every pod set to it.
    quotas = class_quotas(cluster_queue({"any": 6}), FLAVORS, [SLOW, FAST])
    assert {c: q.flavor for c, q in quotas.items()} == {"fast": "any"}


def test_a_flavor_fits_when_it_agrees_on_the_label_keys_its_group_uses() -> None:
    selector = {PRODUCT: "A100", "zone": "a"}
    assert flavor_fits({PRODUCT: "A100"}, selector, frozenset({PRODUCT}))
    assert not flavor_fits({PRODUCT: "T4"}, selector, frozenset({PRODUCT}))
    assert not flavor_fits({}, selector, frozenset({PRODUCT}))  # the group uses the key: it must match
    assert flavor_fits({}, selector, frozenset())


def test_a_mix_fits_the_nominal_or_the_unused_quota() -> None:
    quotas = class_quotas(cluster_queue({"fast": 4, "slow": 4}, {"fast": 3}), FLAVORS, [FAST, SLOW])
    assert fits({"fast": 4}, quotas, unused=False) and not fits({"fast": 4}, quotas, unused=True)
    assert fits({"fast": 1, "slow": 4}, quotas, unused=True)
    assert not fits({"medium": 1}, quotas, unused=False)


# --- the proposal ----------------------------------------------------------------------------------

CLUSTER = Snapshot(
    (GPUClassInfo("fast", 1.0, 80), GPUClassInfo("slow", 0.25, 16)),
    tuple(NodeInfo(f"{c}-{i}", c, 4, gpus_used_by_others=3) for c in ("fast", "slow") for i in range(2)),
    (),
)


def request(gpus_min: int, gpus_max: int | None = None, classes: tuple[str, ...] = ()) -> JobRequest:
    return JobRequest("team/train", gpus_min, gpus_max or gpus_min, 64, 0.0, allowed_classes=classes)


def test_the_proposal_takes_the_fastest_gpus_the_quota_admits_whoever_uses_the_nodes() -> None:
    # Nodes are nearly full of other pods: the proposal is about quota, Kueue admits against it.
    proposal = propose(request(3), CLUSTER, {"fast": 2, "slow": 4})
    assert proposal.mix is not None
    assert [(s.gpu_class, s.workers) for s in proposal.mix.shares] == [("fast", 2), ("slow", 1)]
    assert proposal.samples_per_second is not None and proposal.samples_per_second > 0


def test_without_fast_quota_the_proposal_is_slow_gpus_only() -> None:
    proposal = propose(request(3), CLUSTER, {"fast": 0, "slow": 4})
    assert proposal.mix is not None and proposal.mix.key() == "slow:3x1"


def test_an_elastic_job_is_proposed_within_the_quota_and_its_gpus_max() -> None:
    proposal = propose(request(2, 16), CLUSTER, {"fast": 4, "slow": 0})
    assert proposal.mix is not None
    assert {s.gpu_class for s in proposal.mix.shares} == {"fast"}
    assert 2 <= proposal.mix.total_gpus <= 4


@pytest.mark.parametrize(
    ("job", "caps", "problem"),
    [
        (request(2, classes=("slow",)), {"fast": 4}, "no quota for any of its GPU classes"),
        (request(6), {"fast": 2, "slow": 3}, "no placement fits within the quota (fast: 2, slow: 3 GPUs)"),
    ],
)
def test_no_proposal_says_why(job: JobRequest, caps: dict[str, int], problem: str) -> None:
    proposal = propose(job, CLUSTER, caps)
    assert proposal.mix is None and proposal.problem is not None and problem in proposal.problem


# --- what the watch keeps of a Workload, and which status change is still due ---------------------


def workload(conditions: list[dict[str, Any]], admitted: bool = True, labels: bool = True) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": "train-0a1b2c3d",
        "namespace": "team",
        "resourceVersion": "7",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "annotations": {PROPOSED_AT_ANNOTATION: "1767225600.500"},
    }
    if labels:
        metadata["labels"] = {
            "heterotrain.io/job": "train",
            "app.kubernetes.io/managed-by": "heterotrain-operator",
            "kueue.x-k8s.io/job-uid": "uid-1",
        }
    status: dict[str, Any] = {"conditions": conditions}
    if admitted:
        status["admission"] = {
            "clusterQueue": "gpus",
            "podSetAssignments": [{"name": "fast", "flavors": {GPU: "fast"}, "count": 2}],
        }
    return {"metadata": metadata, "spec": {"podSets": [{"name": "fast", "count": 2}]}, "status": status}


def condition(
    kind: str, status: bool, reason: str = "R", when: str = "2026-01-01T00:10:00Z"
) -> dict[str, Any]:
    return {"type": kind, "status": str(status), "reason": reason, "message": "", "lastTransitionTime": when}


ADMITTED = [condition("QuotaReserved", True), condition("Admitted", True)]
NOW = dt.datetime(2026, 1, 1, 1, 0, tzinfo=dt.UTC)


def test_the_watch_keeps_a_jobs_workload_with_its_mix_and_when_it_began_to_wait() -> None:
    facts = WorkloadFacts.from_body(workload([condition("QuotaReserved", False, "Pending")], admitted=False))
    assert facts is not None
    assert (facts.job_key, facts.job_uid, facts.mix()) == ("team/train", "uid-1", {"fast": 2})
    assert facts.proposed_at == 1767225600.5
    assert facts.pending_since == dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.UTC).timestamp()
    assert WorkloadFacts.from_body(workload(ADMITTED, labels=False)) is None, "not a HeteroTrainJob's"


def test_a_release_is_due_only_while_evicted_with_the_quota() -> None:
    evicted = workload([*ADMITTED, condition("Evicted", True, "Preempted")])
    assert due_patch(WorkloadChange.RELEASE, evicted, NOW) is not None
    released = workload(
        [condition("QuotaReserved", False), condition("Evicted", True, "Preempted")], admitted=False
    )
    assert due_patch(WorkloadChange.RELEASE, released, NOW) is None


def test_finishing_and_pods_ready_are_written_once() -> None:
    assert due_patch(WorkloadChange.FINISH, workload(ADMITTED), NOW, True, "done") is not None
    finished = workload([*ADMITTED, condition("Finished", True, "Succeeded")])
    assert due_patch(WorkloadChange.FINISH, finished, NOW) is None
    ready = due_patch(WorkloadChange.PODS_READY, workload(ADMITTED), NOW)
    assert ready is not None
    assert {c["type"]: c["status"] for c in ready["status"]["conditions"]}["PodsReady"] == "True"
    assert (
        due_patch(WorkloadChange.PODS_READY, workload([*ADMITTED, condition("PodsReady", True)]), NOW) is None
    )
