"""Time limits through the whole scheduling loop, in process, on a clock the test moves: a start
that times out releases its GPUs and is placed again after the backoff, and a finished job is
deleted once its TTL has passed."""

from __future__ import annotations

import asyncio

from tests.operator.inprocess import Cluster

from hetero_operator.controller.actions import DeleteJob

TWO_NODES = {"fast-0": ("fast", 2), "slow-0": ("slow", 4)}


def test_a_start_that_times_out_frees_the_gpus_and_is_placed_again_after_the_backoff() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit(
            "train",
            gpus={"min": 2, "max": 2},
            startTimeoutSeconds=120,
            restartPolicy={"maxRestarts": 1, "backoffSeconds": 30},
        )
        await cluster.cycle()
        assert sorted(cluster.pods("train")) == ["train-g0-w0", "train-g0-w1"]
        cluster.kube.set_pod("team", "train-g0-w0", "Running")
        cluster.kube.set_pod("team", "train-g0-w1", "Pending", waiting="ImagePullBackOff")
        cluster.advance(119)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"

        cluster.advance(1)
        await cluster.cycle()
        status = cluster.status("train")
        assert (status["phase"], status["restarts"]) == ("Queued", 1)
        assert status["allocation"]["workers"] == []  # the GPUs are free for others
        message = cluster.condition("train", "Placed")["message"]
        assert message.startswith("worker pod train-g0-w1 not Running after 120 s: ImagePullBackOff")
        assert cluster.pods("train") == {}
        assert [e["reason"] for e in cluster.events("StartTimeout")] == ["StartTimeout"]

        cluster.advance(29)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Queued", "not placed before the 30 s backoff"
        cluster.advance(1)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Starting"
        assert sorted(cluster.pods("train")) == ["train-g1-w0", "train-g1-w1"]

        cluster.kube.set_pod("team", "train-g1-w1", "Pending", waiting="ErrImagePull")
        cluster.advance(120)
        await cluster.cycle()
        assert cluster.status("train")["phase"] == "Failed"
        failed = cluster.condition("train", "Failed")
        assert failed["reason"] == "StartTimeout" and "train-g1-w1" in failed["message"]
        assert "ErrImagePull" in failed["message"]

    asyncio.run(scenario())


def test_a_finished_job_is_deleted_with_what_it_owns_after_its_ttl() -> None:
    async def scenario() -> None:
        cluster = Cluster(TWO_NODES)
        cluster.submit("train", gpus={"min": 2, "max": 2}, ttlSecondsAfterFinished=60)
        await cluster.cycle()
        cluster.run_pods("train")
        await cluster.cycle()
        cluster.run_pods("train", "Succeeded", exit_code=0)
        plan = await cluster.cycle()
        assert cluster.status("train")["phase"] == "Succeeded"
        assert plan.wake_in == 60
        cluster.advance(59)
        await cluster.cycle()
        assert cluster.kube.obj("HeteroTrainJob", "team", "train") is not None

        cluster.advance(1)
        plan = await cluster.cycle()
        write = plan.write_for("team/train")
        assert write is not None and DeleteJob() in write.actions
        await cluster.cycle()  # the finalizer's clean-up
        assert cluster.kube.obj("HeteroTrainJob", "team", "train") is None
        assert cluster.pods("train") == {}

    asyncio.run(scenario())
