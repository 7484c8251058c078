"""The scheduling loop with the Kueue integration on, in process: Kueue's side is played by the test
(tests/operator/kueue_played.py) so every step of the handshake can be stopped and looked at. The
same paths run against the real Kueue in tests/kueue/test_kueue_operator_live.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from tests.operator.inprocess import GRACE, Cluster
from tests.operator.kueue_played import LABELS, PlayedKueue

from hetero_operator.controller import names
from hetero_operator.controller.kueue_step import KueueConfig

NODES = {"fast-0": ("fast", 4), "slow-0": ("slow", 4)}
REPROPOSE = 60.0


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def setup(quotas: dict[str, int]) -> tuple[Cluster, PlayedKueue]:
    cluster = Cluster(NODES, kueue=KueueConfig(REPROPOSE))
    return cluster, PlayedKueue(cluster, quotas)


def classes_of_pods(cluster: Cluster, job: str) -> Counter[str]:
    node_class = {"fast-0": "fast", "slow-0": "slow"}
    return Counter(node_class[p["spec"]["nodeName"]] for p in cluster.pods(job).values())


def checkpoint_requested(pod: dict[str, Any]) -> bool:
    return names.CHECKPOINT_REQUESTED_ANNOTATION in pod["metadata"].get("annotations", {})


async def running_job(quotas: dict[str, int] | None = None) -> tuple[Cluster, PlayedKueue, str]:
    """A two-GPU job "train", admitted and running; returns its Workload's name too."""
    cluster, kueue = setup(quotas or {"fast": 4})
    cluster.submit("train", labels=LABELS, gpus={"min": 2, "max": 2})
    return cluster, kueue, await admitted_and_running(cluster, kueue, "train")


async def evicted_and_stopped(
    cluster: Cluster, kueue: PlayedKueue, workload: str, reason: str = "Preempted"
) -> None:
    """Kueue evicts the job; its workers save a checkpoint, and stop once the grace is over."""
    await kueue.evict(workload, reason, f"evicted: {reason}")
    await cluster.cycle()
    cluster.clock.advance(GRACE + 1)
    await cluster.cycle()


async def admitted_and_running(cluster: Cluster, kueue: PlayedKueue, job: str) -> str:
    await cluster.cycle()
    workload = kueue.only(job)["metadata"]["name"]
    await kueue.admit(workload)
    await cluster.cycle()
    cluster.run_pods(job)
    await cluster.cycle()
    assert cluster.status(job)["phase"] == "Running"
    return str(workload)


def test_a_labelled_job_waits_for_admission_then_runs_on_exactly_the_admitted_gpus() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 2, "slow": 4})
        cluster.submit("train", labels=LABELS, gpus={"min": 3, "max": 3}, batch={"global": 60})
        await cluster.cycle()
        # The fastest GPUs the quota admits: both fast ones (the quota's cap), then one slow.
        assert kueue.mix("train") == {"fast": 2, "slow": 1}
        workload = kueue.only("train")
        assert workload["spec"]["queueName"] == "team"
        assert workload["metadata"]["ownerReferences"][0]["name"] == "train"
        assert cluster.pods("train") == {}, "no worker before Kueue admits the Workload"
        admitted = cluster.condition("train", "Admitted")
        assert (admitted["status"], admitted["reason"]) == ("False", "Submitted")
        assert "fast: 2, slow: 1 GPUs" in admitted["message"]
        for _ in range(3):  # the scheduler leaves it alone however long it waits
            cluster.clock.advance(5)
            await cluster.cycle()
        assert cluster.pods("train") == {} and cluster.status("train")["phase"] == "Queued"

        await kueue.admit(workload["metadata"]["name"])
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"
        assert classes_of_pods(cluster, "train") == Counter({"fast": 2, "slow": 1})
        assert cluster.condition("train", "Admitted")["status"] == "True"

    run(scenario)


def test_an_admitted_job_is_never_grown_beyond_its_admission() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 2})
        cluster.submit("elastic", labels=LABELS, gpus={"min": 2, "max": 8}, batch={"global": 64})
        await admitted_and_running(cluster, kueue, "elastic")
        for _ in range(3):  # idle GPUs everywhere: an unlabelled job would grow into them
            cluster.clock.advance(5)
            await cluster.cycle()
        assert cluster.status("elastic")["allocation"]["totalGpus"] == 2
        assert classes_of_pods(cluster, "elastic") == Counter({"fast": 2})

    run(scenario)


def test_an_unlabelled_job_is_placed_at_once_without_a_workload() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 2})
        cluster.submit("plain", gpus={"min": 2, "max": 2})
        await cluster.cycle()
        assert cluster.status("plain")["phase"] == "Starting"
        assert kueue.workloads() == []

    run(scenario)


def test_an_eviction_checkpoints_stops_the_workers_then_hands_the_admission_back() -> None:
    async def scenario() -> None:
        cluster, kueue, workload = await running_job()
        await kueue.evict(workload, "Preempted", "Preempted to accommodate a workload")
        await cluster.cycle()
        assert cluster.condition("train", "Draining")["reason"] == "Evicted"
        assert all(checkpoint_requested(p) for p in cluster.pods("train").values())
        assert "admission" in kueue.only("train")["status"], "the quota is kept while the workers save"

        cluster.clock.advance(GRACE + 1)
        await cluster.cycle()  # grace over: the workers are stopped
        assert cluster.pods("train") == {}
        assert cluster.status("train")["phase"] == "Queued"
        await cluster.cycle()  # none runs any more: the admission goes back
        status = kueue.only("train")["status"]
        assert "admission" not in status
        conditions = kueue.conditions(workload)
        assert (conditions["QuotaReserved"]["status"], conditions["Requeued"]["status"]) == ("False", "True")
        assert cluster.condition("train", "Admitted")["reason"] == "Released"

        kueue.release_usage(workload)
        await kueue.admit(workload)  # requeued and admitted again: a new generation starts
        await cluster.cycle()
        assert sorted(cluster.pods("train")) == ["train-g1-w0", "train-g1-w1"]
        started, stopped = (e["message"] for e in cluster.events("Evicted"))
        assert "saving a checkpoint first" in started and "workers stopped" in stopped

    run(scenario)


@pytest.mark.parametrize(
    ("reason", "requeued"),
    [("PodsReadyTimeout", "False"), ("ClusterQueueStopped", "False"), ("NodeFailures", "True")],
)
def test_every_eviction_drains_the_job_and_hands_the_admission_back(reason: str, requeued: str) -> None:
    async def scenario() -> None:
        cluster, kueue, workload = await running_job()
        await evicted_and_stopped(cluster, kueue, workload, reason)
        assert cluster.pods("train") == {} and cluster.status("train")["phase"] == "Queued"
        assert cluster.condition("train", "Placed")["reason"] == "Evicted"
        await cluster.cycle()
        assert "admission" not in kueue.only("train")["status"]
        assert kueue.conditions(workload)["Requeued"]["status"] == requeued

    run(scenario)


def test_a_finished_job_marks_its_workload_finished() -> None:
    async def scenario() -> None:
        cluster, kueue, workload = await running_job()
        ready = kueue.conditions(workload)["PodsReady"]
        assert ready["status"] == "True", "every worker runs: Kueue's waitForPodsReady is satisfied"
        cluster.run_pods("train", "Succeeded", exit_code=0)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Succeeded"
        finished = kueue.conditions(workload)["Finished"]
        assert (finished["status"], finished["reason"]) == ("True", "Succeeded")
        assert "admission" in kueue.only("train")["status"], "a finished Workload keeps its record"

    run(scenario)


def test_suspend_deactivates_the_workload_and_resume_activates_it() -> None:
    async def scenario() -> None:
        cluster, kueue, workload = await running_job()
        path = "/apis/heterotrain.io/v1alpha1/namespaces/team/heterotrainjobs/train"
        await cluster.kube.merge_patch(path, {"spec": {"suspend": True}})
        await cluster.cycle()
        assert kueue.only("train")["spec"]["active"] is False
        assert cluster.condition("train", "Draining")["reason"] == "Suspended"
        await kueue.evict(workload, "Deactivated", "The workload is deactivated")
        cluster.clock.advance(GRACE + 1)
        await cluster.cycle()
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Suspended"
        assert kueue.conditions(workload)["Requeued"]["status"] == "False", "it waits for spec.active"
        assert "admission" not in kueue.only("train")["status"]

        await cluster.kube.merge_patch(path, {"spec": {"suspend": False}})
        await cluster.cycle()
        assert kueue.only("train")["spec"]["active"] is True
        assert cluster.status("train")["phase"] == "Queued"

    run(scenario)


def test_a_workload_waiting_too_long_is_replaced_by_a_mix_the_unused_quota_admits() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 4, "slow": 4})
        cluster.submit("holder", labels=LABELS, gpus={"min": 4, "max": 4})
        await admitted_and_running(cluster, kueue, "holder")
        cluster.submit("waiter", labels=LABELS, gpus={"min": 2, "max": 2})
        await cluster.cycle()
        first = kueue.only("waiter")["metadata"]["name"]
        assert kueue.mix("waiter") == {"fast": 2}
        kueue_says = "insufficient unused quota for nvidia.com/gpu in flavor fast, 2 more needed"
        await kueue.pending(first, kueue_says)
        await cluster.cycle()
        waiting = cluster.condition("waiter", "Admitted")
        assert waiting["reason"] == "Pending"
        assert first in waiting["message"] and "fast: 2 GPUs" in waiting["message"]
        assert kueue_says in waiting["message"]

        cluster.clock.advance(REPROPOSE - 5)
        await cluster.cycle()
        assert [w["metadata"]["name"] for w in kueue.workloads("waiter")] == [first]
        cluster.clock.advance(10)
        await cluster.cycle()
        assert kueue.mix("waiter") == {"slow": 2}, "the best mix the unused quota admits"
        reproposed = cluster.condition("waiter", "Admitted")
        assert reproposed["reason"] == "Reproposed"
        assert first in reproposed["message"] and "slow: 2 GPUs" in reproposed["message"]

    run(scenario)


def test_classes_no_cluster_queue_offers_are_named_with_the_queue() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 4})
        cluster.submit("slowpoke", labels=LABELS, gpus={"min": 1, "max": 1}, gpuClasses=["slow"])
        await cluster.cycle()
        assert kueue.workloads() == []
        condition = cluster.condition("slowpoke", "Admitted")
        assert (condition["status"], condition["reason"]) == ("False", "ClassesNotOffered")
        assert "ClusterQueue gpus (LocalQueue team)" in condition["message"]
        assert "GPU classes slow" in condition["message"]

    run(scenario)


def test_no_second_workload_while_the_first_is_not_in_the_watch_nor_after_a_restart() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 4, "slow": 4})
        cluster.submit("train", labels=LABELS, gpus={"min": 2, "max": 2})
        cluster.kube.hold_watch()  # the watch lags: it never shows the Workload being created
        await cluster.cycle()
        kueue._set_usage("fast", 4)  # a proposal now would be another mix
        for _ in range(3):
            await cluster.cycle()
        assert len(kueue.workloads("train")) == 1
        cluster.kube.release_watch()
        await cluster.loop.writers.stop()
        cluster.loop = cluster.new_loop()  # restarted: nothing remembered
        for _ in range(2):
            await cluster.cycle()
        assert len(kueue.workloads("train")) == 1
        await kueue.admit(kueue.only("train")["metadata"]["name"])
        await cluster.cycle()
        await cluster.cycle()
        assert sorted(cluster.pods("train")) == ["train-g0-w0", "train-g0-w1"]
        assert cluster.kube.count("POST", "Workload/") == 1

    run(scenario)


def test_deleting_the_job_deletes_its_workload() -> None:
    async def scenario() -> None:
        cluster, kueue, _ = await running_job()
        cluster.kube.remove(("heterotrainjobs", "team", "train"))
        await cluster.cycle()
        assert cluster.kube.obj("HeteroTrainJob", "team", "train") is None
        assert kueue.workloads() == [] and cluster.pods("train") == {}

    run(scenario)


def test_a_release_that_meets_a_newer_workload_is_built_again_from_it() -> None:
    async def scenario() -> None:
        cluster, kueue, workload = await running_job()
        await evicted_and_stopped(cluster, kueue, workload)
        touched = []

        def kueue_writes_first() -> None:  # Kueue updates the Workload just before our first apply
            if not touched:
                touched.append(True)
                key = ("workloads", "team", workload)
                cluster.kube._store(key, cluster.kube.objects[key])

        cluster.kube.before("PATCH", f"workloads/{workload}/status", kueue_writes_first)
        before = cluster.kube.count("PATCH", f"workloads/{workload}/status")
        await cluster.cycle()
        assert "admission" not in kueue.only("train")["status"]
        assert cluster.kube.count("PATCH", f"workloads/{workload}/status") - before == 2  # 409, then again

    run(scenario)


def test_a_long_wait_with_no_other_mix_keeps_the_workload_and_writes_nothing_more() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 4})
        cluster.submit("holder", labels=LABELS, gpus={"min": 4, "max": 4})
        await admitted_and_running(cluster, kueue, "holder")
        cluster.submit("waiter", labels=LABELS, gpus={"min": 2, "max": 2})
        await cluster.cycle()
        first = kueue.only("waiter")["metadata"]["name"]
        await kueue.pending(
            first, "insufficient unused quota for nvidia.com/gpu in flavor fast, 2 more needed"
        )
        cluster.clock.advance(REPROPOSE + 1)
        await cluster.cycle()
        assert [w["metadata"]["name"] for w in kueue.workloads("waiter")] == [first]
        assert "no other mix fits the unused quota" in cluster.condition("waiter", "Admitted")["message"]
        for _ in range(3):  # waiting on: no status write, no other Workload
            cluster.clock.advance(7)
            plan = await cluster.cycle()
            assert plan.write_for("team/waiter") is None
        assert kueue.workloads("waiter")[0]["metadata"]["name"] == first

    run(scenario)


def test_a_job_whose_label_is_taken_off_gives_its_workload_up() -> None:
    async def scenario() -> None:
        cluster, kueue = setup({"fast": 4})
        cluster.submit("train", labels=LABELS, gpus={"min": 2, "max": 2})
        await cluster.cycle()
        assert len(kueue.workloads("train")) == 1
        path = "/apis/heterotrain.io/v1alpha1/namespaces/team/heterotrainjobs/train"
        await cluster.kube.merge_patch(path, {"metadata": {"labels": None}})
        await cluster.cycle()
        assert kueue.workloads("train") == []
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting", "scheduled like any other job"

    run(scenario)
