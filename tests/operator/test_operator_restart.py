"""The operator killed with SIGKILL in the middle of placing jobs, then started again."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from tests.operator.live import Jobs, OperatorProcess, wait_for

from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(150)]

JOBS = 6
GPUS_PER_JOB = 4  # 6 x 4 = all 24 GPUs of the example cluster


def test_killed_mid_placement_leaves_no_duplicate_or_orphaned_pods(
    testbed: Testbed, gpu_classes: None, jobs: Jobs, tmp_path: Path
) -> None:
    first = OperatorProcess(testbed, tmp_path / "first.log")
    first.start()
    try:
        wait_for(lambda: "indexes ready" in first.log.read_text(), 30, "the first operator to start")
        jobs.apply(*(jobs.manifest(f"job-{i}", gpus=GPUS_PER_JOB) for i in range(JOBS)))
        # Kill as soon as the first placement is written: its pods (and the other jobs') are being created.
        api = kubernetes.client.CustomObjectsApi(
            kubernetes.config.new_client_from_config(str(testbed.kubeconfig))
        )

        def placed_any() -> bool:
            items: Any = api.list_namespaced_custom_object(
                "heterotrain.io", "v1alpha1", jobs.namespace, "heterotrainjobs"
            )
            return any((item.get("status") or {}).get("allocation") for item in items["items"])

        wait_for(placed_any, 30, "the first placement", interval=0.01)
        first.kill()
    finally:
        first.stop()
    print(f"worker pods when the operator was killed: {len(jobs.pods())} of {JOBS * GPUS_PER_JOB}")
    second = OperatorProcess(testbed, tmp_path / "second.log")
    second.start()
    try:
        for i in range(JOBS):
            jobs.wait_phase(f"job-{i}", "Running", timeout=60)
        check_one_allocation_per_job(jobs)
    finally:
        jobs.delete_all()  # the finalizer needs a running operator
        second.stop()
        print(second.tail())


def check_one_allocation_per_job(jobs: Jobs) -> None:
    pods = jobs.pods()
    names = [p["metadata"]["name"] for p in pods]
    assert len(names) == len(set(names)) == JOBS * GPUS_PER_JOB, names
    for i in range(JOBS):
        allocation = jobs.status(f"job-{i}")["allocation"]
        expected = {
            f"job-{i}-g{allocation['generation']}-w{w['rank']}": w["node"] for w in allocation["workers"]
        }
        mine = {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in pods
            if p["metadata"]["labels"]["heterotrain.io/job"] == f"job-{i}"
        }
        assert mine == expected  # every pod belongs to the job's one allocation: no orphans, no extras
    per_node = Counter(p["spec"]["nodeName"] for p in pods)
    assert max(per_node.values()) <= 4  # no node handed out more GPUs than it has
