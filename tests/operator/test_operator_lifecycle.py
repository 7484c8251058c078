"""A job's whole life on the live test bed: placement, workers, restarts, suspension, deletion."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from tests.operator.live import Jobs, OperatorProcess, wait_for

from hetero_operator import plan as contract
from hetero_operator.controller import names
from hetero_operator.testbed.cluster import Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.timeout(120)]


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_full_lifecycle_to_success(operator: OperatorProcess, jobs: Jobs, testbed: Testbed) -> None:
    jobs.apply(jobs.manifest("train", gpus=3, gpuClasses=["medium", "slow"], batch={"global": 60}))
    status = jobs.wait_phase("train", "Running")
    allocation = status["allocation"]
    assert allocation["totalGpus"] == 3 and allocation["generation"] == 0
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert (
        conditions["Valid"] == "True" and conditions["Placed"] == "True" and conditions["PodsReady"] == "True"
    )
    pods = jobs.running_pods("train")
    assert [p["metadata"]["name"] for p in pods] == ["train-g0-w0", "train-g0-w1", "train-g0-w2"]
    for pod, worker in zip(pods, allocation["workers"], strict=True):
        assert pod["spec"]["nodeName"] == worker["node"]  # bound by the operator itself
        assert env_of(pod)[contract.RANK_ENV] == str(worker["rank"])
        assert env_of(pod)[contract.WORLD_SIZE_ENV] == "3"
    config_map = yaml.safe_load(jobs.kubectl("get", "configmap", "train-plan", "-o", "yaml"))
    plan = contract.Plan.from_json(config_map["data"][contract.PLAN_CONFIGMAP_KEY])
    assert plan.local_batches == status["plan"]["localBatches"] and sum(plan.local_batches) == 60
    table = jobs.kubectl("get", "htj", "train")
    assert "Running" in table and allocation["classes"] in table  # printer columns are filled
    jobs.finish(pods, 0)
    status = jobs.wait_phase("train", "Succeeded")
    assert status["observedGeneration"] == 1
    assert wait_for(lambda: {"Placed", "Running", "Succeeded"} <= set(jobs.events("train")), 10, "events")


def job_writes(testbed: Testbed) -> Counter[tuple[str, str, str]]:
    """The API server's count of requests on HeteroTrainJobs: (verb, subresource, code)."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(testbed.kubectl("get", "--raw", "/metrics").stdout):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "apiserver_request_total" and labels.get("resource") == "heterotrainjobs":
                key = (labels.get("verb", ""), labels.get("subresource", ""), labels.get("code", ""))
                counts[key] += int(sample.value)
    return counts


def test_a_burst_of_jobs_is_placed_without_a_conflicting_write(
    operator: OperatorProcess, jobs: Jobs, testbed: Testbed
) -> None:
    # Each new job gets our finalizer and its first status writes; a status write preconditioned on
    # a resourceVersion older than the finalizer's write would be refused (409) and read again.
    before = job_writes(testbed)
    burst = [f"burst-{i}" for i in range(8)]
    jobs.apply(*(jobs.manifest(name, gpus=1) for name in burst))
    for name in burst:
        jobs.wait_phase(name, "Running")
    made = job_writes(testbed)
    made.subtract(before)
    conflicts = {key: n for key, n in made.items() if key[2] == "409" and n}
    rereads = made[("GET", "status", "200")]
    assert made[("PATCH", "", "200")] >= len(burst)  # the finalizers
    assert made[("PATCH", "status", "200")] >= len(burst)
    assert not conflicts and rereads == 0, f"conflicts {conflicts}, status re-read {rereads} times"
    jobs.delete_all()


def test_invalid_spec_that_passes_the_schema_is_marked_not_valid(
    operator: OperatorProcess, jobs: Jobs
) -> None:
    bad = jobs.manifest(
        "pipes",
        gpus=(4, 5),
        parallelism={"strategy": "hetpipe", "hetpipe": {"virtualWorkerSize": 3}},
    )
    jobs.apply(bad)  # the API server accepts it: 3 <= gpus.max
    condition = wait_for(lambda: jobs.condition("pipes", "Valid"), 20, "a Valid condition")
    assert condition["status"] == "False"
    assert "spec.parallelism.hetpipe.virtualWorkerSize" in condition["message"]
    assert jobs.phase("pipes") == "Failed" and jobs.pods("pipes") == []


def test_worker_failure_restarts_a_new_generation_until_restarts_run_out(
    operator: OperatorProcess, jobs: Jobs
) -> None:
    jobs.apply(jobs.manifest("flaky", gpus=2, restartPolicy={"maxRestarts": 1, "backoffSeconds": 1}))
    jobs.wait_phase("flaky", "Running")
    jobs.finish(jobs.running_pods("flaky")[:1], 3)
    wait_for(lambda: jobs.status("flaky").get("restarts") == 1, 20, "the first restart")
    status = jobs.wait_phase("flaky", "Running")
    assert status["allocation"]["generation"] == 1
    assert [p["metadata"]["name"] for p in jobs.running_pods("flaky")] == ["flaky-g1-w0", "flaky-g1-w1"]
    jobs.finish(jobs.running_pods("flaky")[1:], 7)
    status = jobs.wait_phase("flaky", "Failed")
    assert status["restarts"] == 1
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "exit code 7" in failed["message"] and "maxRestarts=1" in failed["message"]
    wait_for(lambda: not jobs.running_pods("flaky") or None, 20, "no worker left running")


def test_suspend_checkpoints_stops_and_resume_starts_again(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("pause", gpus=2, checkpoint={"path": "/checkpoints"}))
    jobs.wait_phase("pause", "Running")
    jobs.kubectl("patch", "htj", "pause", "--type=merge", "-p", '{"spec": {"suspend": true}}')

    def asked_to_checkpoint() -> list[dict[str, Any]] | None:
        pods = jobs.pods("pause")
        annotated = [
            p for p in pods if names.CHECKPOINT_REQUESTED_ANNOTATION in p["metadata"].get("annotations", {})
        ]
        return annotated if pods and len(annotated) == len(pods) else None

    annotated = wait_for(asked_to_checkpoint, 20, "the workers to be asked for a checkpoint")
    assert len(annotated) == 2
    status = jobs.wait_phase("pause", "Suspended")
    assert status["allocation"].get("workers", []) == []
    wait_for(lambda: not jobs.pods("pause") or None, 20, "the workers to stop")
    claims = jobs.kubectl("get", "pvc", "-o", "name")
    assert "persistentvolumeclaim/pause-checkpoint" in claims  # the checkpoint outlives the pods
    jobs.kubectl("patch", "htj", "pause", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    status = jobs.wait_phase("pause", "Running")
    assert status["allocation"]["generation"] == 1


def test_deleting_a_job_leaves_nothing_behind(operator: OperatorProcess, jobs: Jobs) -> None:
    jobs.apply(jobs.manifest("gone", gpus=2, checkpoint={"path": "/checkpoints"}))
    jobs.wait_phase("gone", "Running")
    jobs.kubectl("delete", "htj", "gone", "--wait=true", "--timeout=30s")

    def leftovers() -> str:
        out = jobs.kubectl(
            "get", "pods,services,configmaps,pvc,htj", "-l", f"{names.LABEL_JOB}=gone", "-o", "name"
        )
        return out + jobs.kubectl("get", "htj", "-o", "name")

    wait_for(lambda: leftovers() == "" or None, 30, "every object of the job to be deleted")
