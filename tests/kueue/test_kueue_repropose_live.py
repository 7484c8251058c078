"""The mix under quota against the real Kueue: a job whose Workload waits longer than the operator's
`--kueue-repropose-after` asks for the best mix the queue's unused quota admits, and runs on it."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from tests.kueue.live import KueueQueue
from tests.kueue.test_kueue_operator_live import (
    REACTS,
    holder_and_waiter,
    pods_per_class,
    running,
    workloads,
)
from tests.operator.live import Jobs, OperatorProcess, wait_for

from hetero_operator.testbed.cluster import Testbed

pytestmark = pytest.mark.testbed

REPROPOSE_SECONDS = 10  # this module's operator (see tests/kueue/conftest.py)


def test_a_workload_waiting_too_long_is_replaced_by_the_mix_the_unused_quota_admits(
    kueue_testbed: Testbed, kueue_namespace: str, kueue_operator: OperatorProcess, kueue_jobs: Jobs
) -> None:
    KueueQueue(kueue_testbed, kueue_namespace, {"fast": 4, "slow": 2})
    holder_and_waiter(kueue_jobs, 4, "waiter", 2)  # the holder takes every fast GPU the quota has
    (first,) = workloads(kueue_jobs, "waiter")
    assert [(p["name"], p["count"]) for p in first["spec"]["podSets"]] == [("fast", 2)], "the best mix first"

    def replaced() -> list[dict[str, Any]] | None:
        # The end of the replacement, not a moment inside it (the new Workload may exist before the
        # old one is gone): one Workload, another than the first.
        found = workloads(kueue_jobs, "waiter")
        names = [w["metadata"]["name"] for w in found]
        return found if len(names) == 1 and names != [first["metadata"]["name"]] else None

    found = wait_for(replaced, REACTS + REPROPOSE_SECONDS, "the waiter's Workload replaced")
    names = [w["metadata"]["name"] for w in found]
    assert first["metadata"]["name"] not in names and len(names) == 1, names
    assert [(p["name"], p["count"]) for p in found[0]["spec"]["podSets"]] == [("slow", 2)]
    pods = wait_for(lambda: running(kueue_jobs, "waiter", 2), REACTS, "the waiter running on the new mix")
    assert pods_per_class(kueue_testbed, pods) == Counter({"slow": 2})
    (said,) = event_messages(kueue_jobs, "waiter", "Reproposed")
    assert first["metadata"]["name"] in said and "fast: 2 GPUs" in said and "slow: 2 GPUs" in said, said


def event_messages(jobs: Jobs, job: str, reason: str) -> list[str]:
    selector = f"involvedObject.name={job},involvedObject.kind=HeteroTrainJob,reason={reason}"
    out = jobs.kubectl("get", "events", "--field-selector", selector, "-o", "json")
    return [str(e["message"]) for e in json.loads(out)["items"]]
