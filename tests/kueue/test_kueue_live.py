"""The Workload builder and admission reader against the real Kueue v0.19.2 on the test bed.

No operator runs here: each test plays the operator's part of the handshake by hand (finish, hand
an evicted admission back), so the builders are proven against Kueue before the operator uses them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from tests.kueue.live import GPU, WORKLOADS, KueueQueue
from tests.operator.live import wait_for

from hetero_operator.kueue.admission import WorkloadPhase
from hetero_operator.kueue.status_patch import mark_finished, release_after_eviction
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import GPU_CLASS_LABEL

pytestmark = pytest.mark.testbed

QUOTAS = {"fast": 4, "medium": 4, "slow": 4}
KUEUE_REACTS = 30.0  # seconds: Kueue answers within one or two here


def eventually(check: Callable[[], Any], what: str) -> Any:
    return wait_for(check, KUEUE_REACTS, what)


def phase_is(queue: KueueQueue, workload: str, phase: WorkloadPhase) -> bool:
    return queue.read(workload).phase is phase


def test_kueue_webhooks_answer_the_api_server_on_loopback(
    kueue_testbed: Testbed, kueue_namespace: str
) -> None:
    """Only Kueue's validating webhook refuses a pod set that requests `pods` (the schema allows it)."""
    KueueQueue(kueue_testbed, kueue_namespace, QUOTAS)
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "refused", "namespace": kueue_namespace},
        "spec": {
            "queueName": "team",
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "none",
                                    "resources": {"requests": {"pods": "1"}},
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }
    result = kueue_testbed.kubectl("create", "-f", "-", input=yaml.safe_dump(workload), check=False)
    assert result.returncode != 0
    assert "vworkload.kb.io" in result.stderr and "reserved for internal kueue use" in result.stderr


def test_flavors_select_the_nodes_of_their_class(kueue_testbed: Testbed, kueue_namespace: str) -> None:
    """Each class's flavor (node labels = its GPUClass node selector) matches that class's nodes only."""
    queue = KueueQueue(kueue_testbed, kueue_namespace, QUOTAS)
    for name in queue.classes:
        flavor = json.loads(kueue_testbed.kubectl("get", "resourceflavor", name, "-o", "json").stdout)
        selector = ",".join(f"{k}={v}" for k, v in flavor["spec"]["nodeLabels"].items())
        nodes = json.loads(kueue_testbed.kubectl("get", "nodes", "-l", selector, "-o", "json").stdout)[
            "items"
        ]
        assert nodes, f"flavor {name} selects no node"
        assert {n["metadata"]["labels"][GPU_CLASS_LABEL] for n in nodes} == {name}


def test_a_mix_is_admitted_on_its_classes_and_a_second_job_waits_for_the_quota(
    kueue_testbed: Testbed, kueue_namespace: str
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, QUOTAS)
    first = queue.submit(queue.job("first"), {"fast": 3, "slow": 2})
    admitted = eventually(
        lambda: (r := queue.read(first)).phase is WorkloadPhase.ADMITTED and r, "first admitted"
    )
    assert admitted.cluster_queue == queue.cluster_queue
    assert {(p.name, p.flavor(GPU), p.count) for p in admitted.pod_sets} == {
        ("fast", "fast", 3),
        ("slow", "slow", 2),
    }
    assert eventually(lambda: queue.usage() == {"fast": 3, "medium": 0, "slow": 2}, "usage of the first")

    # 3 of 4 fast GPUs are taken: a job asking for 2 waits, and says why.
    second = queue.submit(queue.job("second"), {"fast": 2})
    waiting = eventually(lambda: (r := queue.read(second)).waiting_reason and r, "second evaluated")
    assert waiting.phase is WorkloadPhase.PENDING
    assert "insufficient unused quota" in (waiting.waiting_message or "")
    assert queue.usage() == {"fast": 3, "medium": 0, "slow": 2}

    # The first finishing releases its quota; the second is admitted on the fast flavor.
    queue.apply_status(first, lambda w, now: mark_finished(w, True, "training done", now))
    assert queue.read(first).phase is WorkloadPhase.FINISHED
    second_admitted = eventually(
        lambda: (r := queue.read(second)).phase is WorkloadPhase.ADMITTED and r, "second admitted"
    )
    assert [(p.name, p.flavor(GPU), p.count) for p in second_admitted.pod_sets] == [("fast", "fast", 2)]
    assert eventually(lambda: queue.usage() == {"fast": 2, "medium": 0, "slow": 0}, "usage of the second")


def test_preemption_and_deactivation_hand_the_quota_back(
    kueue_testbed: Testbed, kueue_namespace: str
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, QUOTAS)
    low = queue.submit(queue.job("low", priority=0), {"fast": 3})
    eventually(lambda: phase_is(queue, low, WorkloadPhase.ADMITTED), "low admitted")
    # The ClusterQueue's status shows usage a moment after an admission (Kueue batches its updates).
    eventually(lambda: queue.usage()["fast"] == 3, "usage of low")

    high = queue.submit(queue.job("high", priority=10), {"fast": 4})
    evicted = eventually(lambda: (r := queue.read(low)).phase is WorkloadPhase.EVICTED and r, "low evicted")
    assert evicted.eviction is not None
    assert (evicted.eviction.reason, evicted.eviction.preemption_reason) == ("Preempted", "InClusterQueue")
    # Until the evicted job's workers are gone and its admission handed back, it keeps the quota:
    # the preemptor waits and the usage still counts the evicted job.
    assert queue.read(high).phase is WorkloadPhase.PENDING
    assert queue.usage()["fast"] == 3

    queue.apply_status(low, release_after_eviction)
    eventually(lambda: phase_is(queue, high, WorkloadPhase.ADMITTED), "high admitted after the release")
    requeued = queue.get(WORKLOADS, low)["status"]["conditions"]
    assert {c["type"]: c["status"] for c in requeued}["Requeued"] == "True"
    assert queue.read(low).phase is WorkloadPhase.PENDING

    # spec.active=false (what the job's spec.suspend maps to) evicts; released, it waits inactive.
    kueue_testbed.kubectl(
        "patch", WORKLOADS, high, "-n", kueue_namespace, "--type=merge", "-p", '{"spec":{"active":false}}'
    )
    deactivated = eventually(
        lambda: (r := queue.read(high)).phase is WorkloadPhase.EVICTED and r, "high evicted"
    )
    assert deactivated.eviction is not None and deactivated.eviction.reason == "Deactivated"
    queue.apply_status(high, release_after_eviction)
    eventually(lambda: phase_is(queue, high, WorkloadPhase.INACTIVE), "high inactive")
    readmitted = eventually(
        lambda: (r := queue.read(low)).phase is WorkloadPhase.ADMITTED and r, "low readmitted"
    )
    assert readmitted.eviction is None  # Kueue clears Evicted when it admits again
    assert eventually(lambda: queue.usage()["fast"] == 3, "usage of low again")


def test_deleting_the_job_deletes_its_workload_and_frees_the_quota(
    kueue_testbed: Testbed, kueue_namespace: str
) -> None:
    queue = KueueQueue(kueue_testbed, kueue_namespace, QUOTAS)
    holder = queue.submit(queue.job("holder"), {"medium": 4})
    eventually(lambda: phase_is(queue, holder, WorkloadPhase.ADMITTED), "holder admitted")
    waiter = queue.submit(queue.job("waiter"), {"medium": 1})
    eventually(lambda: queue.read(waiter).waiting_reason, "waiter evaluated")

    kueue_testbed.kubectl("delete", "heterotrainjob", "holder", "-n", kueue_namespace)
    eventually(
        lambda: (
            kueue_testbed.kubectl("get", WORKLOADS, holder, "-n", kueue_namespace, check=False).returncode
            != 0
        ),
        "the owner's garbage collection deletes the Workload",
    )
    eventually(lambda: phase_is(queue, waiter, WorkloadPhase.ADMITTED), "waiter admitted")
    assert eventually(lambda: queue.usage()["medium"] == 1, "usage of the waiter")
