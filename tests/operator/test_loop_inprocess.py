"""The scheduling loop as a whole, in process, on a clock the test moves: what a cycle plans, what
reaches the API server, and in what order. The live test bed covers the same paths against the real
API server (tests/operator/test_operator_*.py); these run in seconds and can stop time anywhere."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.operator.inprocess import GRACE, Cluster

from hetero_operator.controller import names
from hetero_operator.controller.actions import CreateGeneration, PostEvent, PublishPlan
from hetero_operator.controller.k8s import path_of
from hetero_operator.plan import PLAN_CONFIGMAP_KEY, Plan

TWO_NODES = {"fast-0": ("fast", 2), "slow-0": ("slow", 4)}


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_a_placement_writes_the_status_first_then_the_plan_objects_and_an_event() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 3, "max": 3}, batch={"global": 60})
        plan = await cluster.cycle()
        write = plan.write_for("team/train")
        assert write is not None and write.patch["phase"] == "Starting"
        assert [type(a) for a in write.actions] == [PublishPlan, CreateGeneration, PostEvent]
        # Both fast GPUs and one slow one (fastest first), as the GPUs on offer allow.
        status = cluster.status("train")
        workers = [(w["node"], w["gpuClass"]) for w in status["allocation"]["workers"]]
        assert workers == [("fast-0", "fast"), ("fast-0", "fast"), ("slow-0", "slow")]
        pods = cluster.pods("train")
        assert sorted(pods) == ["train-g0-w0", "train-g0-w1", "train-g0-w2"]
        assert {p["spec"]["nodeName"] for p in pods.values()} == {"fast-0", "slow-0"}
        config_map = cluster.kube.obj("ConfigMap", "team", names.plan_config_map_name("train"))
        assert config_map is not None
        published = Plan.from_json(config_map["data"][PLAN_CONFIGMAP_KEY])
        # Speeds 1 : 1 : 0.25 (the GPUClass priors) share 60 samples as 26.7 : 26.7 : 6.7, rounded.
        exact = [60 * s / 2.25 for s in (1, 1, 0.25)]
        assert sum(published.local_batches) == 60
        assert all(abs(b - e) < 1 for b, e in zip(published.local_batches, exact, strict=True))
        assert status["plan"]["localBatches"] == published.local_batches
        assert config_map["metadata"]["ownerReferences"][0]["name"] == "train"
        assert len(cluster.events("Placed")) == 1
        # The job's status went out before anything it leads to was created.
        order = [
            m for m, p in cluster.kube.requests if m in ("PATCH", "POST") and ("status" in p or "Pod/" in p)
        ]
        assert order.index("PATCH") < order.index("POST")

    run(scenario)


def test_a_running_job_is_reported_running_and_left_alone() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 2, "max": 2})
        await cluster.cycle()
        cluster.run_pods("train")
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Running"
        assert cluster.condition("train", "PodsReady")["status"] == "True"
        writes_before = len(cluster.kube.requests)
        plan = await cluster.cycle()
        assert plan.writes == () and len(cluster.kube.requests) == writes_before

    run(scenario)


def test_a_failed_worker_restarts_the_group_after_its_backoff() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit(
            "train", gpus={"min": 2, "max": 2}, restartPolicy={"maxRestarts": 2, "backoffSeconds": 10}
        )
        await cluster.cycle()
        cluster.run_pods("train")
        await cluster.cycle()
        cluster.kube.set_pod("team", "train-g0-w1", "Failed", exit_code=3)
        await cluster.cycle()
        status = cluster.status("train")
        assert (status["phase"], status["restarts"]) == ("Restarting", 1)
        assert "exit code 3" in cluster.condition("train", "Restarting")["message"]
        assert list(cluster.pods("train")) == ["train-g0-w1"]  # the whole group stops; the failed pod is kept
        cluster.clock.advance(5)
        await cluster.cycle()
        assert list(cluster.pods("train")) == ["train-g0-w1"], "no new workers before the 10 s backoff"
        cluster.clock.advance(6)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"
        assert sorted(cluster.pods("train")) == ["train-g1-w0", "train-g1-w1"]

    run(scenario)


def test_the_finalizer_goes_on_first_and_comes_off_after_the_cleanup() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 2, "max": 2})
        await cluster.cycle()
        job = cluster.kube.obj("HeteroTrainJob", "team", "train")
        assert job is not None and names.FINALIZER in job["metadata"]["finalizers"]
        assert cluster.pods("train")
        cluster.kube.remove(("heterotrainjobs", "team", "train"))  # kubectl delete
        assert cluster.kube.obj("HeteroTrainJob", "team", "train") is not None, "the finalizer holds it"
        await cluster.cycle()
        assert cluster.kube.obj("HeteroTrainJob", "team", "train") is None
        assert cluster.pods("train") == {}
        for kind, name in names.job_objects("train"):
            assert cluster.kube.obj(kind, "team", name) is None

    run(scenario)


def test_a_status_write_that_never_lands_creates_nothing_and_is_tried_again() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 2, "max": 2})
        cluster.kube.fail("PATCH", "/status", status=500, times=3)
        await cluster.cycle()  # the placement's status write fails
        assert "phase" not in cluster.status("train")
        assert cluster.pods("train") == {}, "no pod before its job's status is stored"
        assert cluster.kube.count("POST", "ConfigMap/") == 0
        for _ in range(3):
            cluster.clock.advance(1)
            await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"
        assert sorted(cluster.pods("train")) == ["train-g0-w0", "train-g0-w1"]

    run(scenario)


def test_a_cycle_before_the_watch_shows_a_write_assumes_it() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("first", gpus={"min": 2, "max": 2})
        cluster.kube.hold_watch()  # the watch shows nothing this replica writes from now on
        cluster.submit("second", gpus={"min": 2, "max": 2})
        cluster.kube.release_watch()
        await cluster.cycle()
        cluster.kube.hold_watch()
        plan = await cluster.cycle()
        # The watch still shows both jobs unplaced; the loop knows what it wrote and places nothing twice.
        assert plan.decisions.place == {}
        cluster.kube.release_watch()
        placed = {
            w["node"] for name in ("first", "second") for w in cluster.status(name)["allocation"]["workers"]
        }
        assert placed == {"fast-0", "slow-0"}
        assert cluster.kube.count("POST", "Pod/") == 4

    run(scenario)


def test_an_operator_restarted_between_the_status_write_and_the_pods_creates_them_once() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 3, "max": 3})
        cluster.kube.fail("POST", "Pod/", status=503, times=3)  # the first operator dies creating pods
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"
        assert len(cluster.pods("train")) == 0
        await cluster.loop.writers.stop()
        cluster.loop = cluster.new_loop()  # a new process: nothing remembered
        await cluster.cycle()
        await cluster.cycle()
        assert sorted(cluster.pods("train")) == ["train-g0-w0", "train-g0-w1", "train-g0-w2"]
        assert cluster.kube.count("POST", "Pod/") == 3 + 3  # three refused, three created: none twice
        assert cluster.status("train")["allocation"]["generation"] == 0

    run(scenario)


def test_a_waiting_job_says_why_per_class_in_its_status() -> None:
    async def scenario() -> None:
        cluster = Cluster({"slow-0": ("slow", 4), "fast-0": ("fast", 2)})
        cordon = {"key": "maintenance", "value": "now", "effect": "NoSchedule"}
        body = cluster.kube.obj("Node", "", "fast-0")
        assert body is not None
        body["spec"]["taints"] = [cordon]
        cluster.submit("big", gpus={"min": 8, "max": 8}, batch={"global": 64})
        await cluster.cycle()
        placed = cluster.condition("big", "Placed")
        assert (placed["status"], placed["reason"]) == ("False", "InsufficientCapacity")
        assert "taint maintenance=now:NoSchedule not tolerated" in placed["message"]
        waiting = cluster.status("big")["waiting"]
        by_class = {c["gpuClass"]: c for c in waiting["classes"]}
        assert by_class["fast"]["verdict"] == "NoSchedulableNodes"
        assert by_class["fast"]["excluded"] == [
            {"filter": "taint maintenance=now:NoSchedule not tolerated", "nodes": 1}
        ]
        assert (by_class["slow"]["free"], by_class["slow"]["wanted"]) == (4, 8)

    run(scenario)


def test_a_shrink_drains_and_restarts_on_exactly_the_gpus_decided() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 4)})
        cluster.submit("elastic", gpus={"min": 2, "max": 4}, batch={"global": 64}, priority=0)
        await cluster.cycle()
        cluster.run_pods("elastic")
        await cluster.cycle()
        assert cluster.status("elastic")["allocation"]["totalGpus"] == 4
        cluster.submit("urgent", gpus={"min": 2, "max": 2}, priority=5)
        await cluster.cycle()
        # The elastic job gives back two GPUs: its workers are asked to save a checkpoint first.
        status = cluster.status("elastic")
        assert cluster.condition("elastic", "Draining")["reason"] == "Resized"
        assert (status["allocation"]["generation"], status["allocation"]["totalGpus"]) == (1, 2)
        annotated = [
            p
            for p in cluster.pods("elastic").values()
            if names.CHECKPOINT_REQUESTED_ANNOTATION in p["metadata"].get("annotations", {})
        ]
        assert len(annotated) == 4
        assert cluster.pods("urgent") == {}, "the head waits while the GPUs are being handed back"
        cluster.clock.advance(GRACE + 1)
        await cluster.cycle()  # grace over: old workers stop, the plan for two workers is published
        assert cluster.pods("elastic") == {}
        config_map = cluster.kube.obj("ConfigMap", "team", names.plan_config_map_name("elastic"))
        assert config_map is not None
        assert Plan.from_json(config_map["data"][PLAN_CONFIGMAP_KEY]).world_size == 2
        await cluster.cycle()
        assert sorted(cluster.pods("elastic")) == ["elastic-g1-w0", "elastic-g1-w1"]
        assert sorted(cluster.pods("urgent")) == ["urgent-g0-w0", "urgent-g0-w1"]
        assert cluster.status("elastic").get("restarts", 0) == 0, "a resize is no failure"

    run(scenario)


def test_a_starting_job_takes_back_faster_gpus_a_job_grew_into_and_starts_on_them() -> None:
    async def scenario() -> None:
        # Per-GPU speeds 1 (fast) and 0.25 (slow): the newcomer would run 4x as fast on fast GPUs.
        cluster = Cluster({"fast-0": ("fast", 4), "slow-0": ("slow", 4)})
        cluster.submit("grown", gpus={"min": 2, "max": 4}, batch={"global": 64}, gpuClasses=["fast"])
        await cluster.cycle()
        cluster.run_pods("grown")
        await cluster.cycle()
        assert cluster.status("grown")["allocation"]["totalGpus"] == 4
        cluster.submit("newcomer", gpus={"min": 2, "max": 2}, batch={"global": 64})
        await cluster.cycle()
        assert cluster.condition("grown", "Draining")["reason"] == "Resized"
        assert cluster.status("grown")["allocation"]["totalGpus"] == 2
        placed = cluster.condition("newcomer", "Placed")
        assert (placed["status"], placed["reason"]) == ("False", "ReclaimingGrownGPUs")
        assert "team/grown" in placed["message"] and "fast" in placed["message"]
        assert cluster.pods("newcomer") == {}, "it waits for the fast GPUs, not on the slow ones"
        await cluster.cycle()  # the old workers are still saving a checkpoint: it keeps waiting
        assert cluster.pods("newcomer") == {}
        assert cluster.condition("newcomer", "Placed")["reason"] == "ReclaimingGrownGPUs"
        cluster.clock.advance(GRACE + 1)
        await cluster.cycle()
        await cluster.cycle()
        assert {p["spec"]["nodeName"] for p in cluster.pods("newcomer").values()} == {"fast-0"}
        assert {p["spec"]["nodeName"] for p in cluster.pods("grown").values()} == {"fast-0"}
        assert cluster.status("grown").get("restarts", 0) == 0, "a resize is no failure"

    run(scenario)


def test_a_job_near_its_end_by_its_eta_is_not_grown_and_one_with_long_left_is() -> None:
    async def scenario() -> None:
        cluster = Cluster({"fast-0": ("fast", 4)})
        cluster.submit("other", gpus={"min": 2, "max": 2}, batch={"global": 64})
        cluster.advance(1)
        cluster.submit("elastic", gpus={"min": 2, "max": 4}, batch={"global": 64})
        await cluster.cycle()
        cluster.run_pods("other")
        cluster.run_pods("elastic")
        await cluster.cycle()
        assert cluster.status("elastic")["allocation"]["totalGpus"] == 2

        async def eta(seconds: float) -> None:  # what the progress task writes
            path = path_of("HeteroTrainJob", "team", "elastic", "status")
            progress = {"epoch": 3, "samplesPerSecond": 100.0, "etaSeconds": seconds}
            await cluster.kube.merge_patch(path, {"status": {"progress": progress}})

        # Twice the GPUs saves at most half of the 30 s left: less than a restart costs (60 s).
        await eta(30.0)
        cluster.run_pods("other", "Succeeded", exit_code=0)
        for _ in range(3):
            await cluster.cycle()
        assert cluster.status("other")["phase"] == "Succeeded"
        assert cluster.status("elastic")["allocation"]["totalGpus"] == 2
        assert not any(c["type"] == "Draining" for c in cluster.status("elastic")["conditions"])
        # With an hour left the same growth pays: it drains to restart on four GPUs.
        await eta(3600.0)
        await cluster.cycle()
        assert cluster.condition("elastic", "Draining")["reason"] == "Resized"
        assert cluster.status("elastic")["allocation"]["totalGpus"] == 4

    run(scenario)
