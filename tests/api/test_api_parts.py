"""The API's pure parts: review bodies, job views, pool counts and the CLI's log helpers."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from api_cases import job_spec
from rich.console import Console

from hetero_operator.api.access import (
    Caller,
    Permission,
    access_review,
    caller_from_token_review,
    token_review,
    verdict_from_access_review,
)
from hetero_operator.api.jobs import job_detail, job_summary
from hetero_operator.api.pools import pools
from hetero_operator.cli.job_tables import age, describe_job
from hetero_operator.cli.jobs import local_log_path, what_if_request, worker_pods
from hetero_operator.controller.facts import JobFacts
from hetero_operator.scheduler import Allocation, GPUClassInfo, JobRequest, NodeInfo, Snapshot, WorkerSlot


def test_token_review_round_trip() -> None:
    assert token_review("abc")["spec"] == {"token": "abc"}
    review = {
        "status": {
            "authenticated": True,
            "user": {
                "username": "system:serviceaccount:team:reader",
                "uid": "u-1",
                "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["p"]},
            },
        }
    }
    caller = caller_from_token_review(review)
    assert caller == Caller(
        "system:serviceaccount:team:reader",
        "u-1",
        ("system:serviceaccounts", "system:authenticated"),
        {"authentication.kubernetes.io/pod-name": ("p",)},
    )
    assert caller_from_token_review({"status": {"authenticated": False, "error": "expired"}}) is None
    assert caller_from_token_review({}) is None


def test_access_review_carries_the_callers_identity_and_the_resource() -> None:
    caller = Caller("alice", "u-2", ("devs",), {"scope": ("a", "b")})
    body = access_review(caller, Permission("get", "heterotrainjobs", "team", "train"))
    assert body["spec"] == {
        "user": "alice",
        "uid": "u-2",
        "groups": ["devs"],
        "extra": {"scope": ["a", "b"]},
        "resourceAttributes": {
            "verb": "get",
            "group": "heterotrain.io",
            "resource": "heterotrainjobs",
            "namespace": "team",
            "name": "train",
        },
    }
    cluster_wide = access_review(Caller("bob"), Permission("list", "gpuclasses"))["spec"]
    assert cluster_wide["resourceAttributes"]["namespace"] == "" and "uid" not in cluster_wide
    assert verdict_from_access_review({"status": {"allowed": True}}).allowed
    denied = verdict_from_access_review({"status": {"allowed": False, "reason": "no RBAC policy matched"}})
    assert not denied.allowed and denied.reason == "no RBAC policy matched"
    assert not verdict_from_access_review({"status": {"allowed": True, "denied": True}}).allowed
    assert (
        Permission("list", "heterotrainjobs").describe() == "list heterotrainjobs.heterotrain.io cluster-wide"
    )


def _job_body(status: dict[str, Any] | None, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": "train", "namespace": "team", "creationTimestamp": "2030-01-01T00:00:00Z"},
        "spec": spec or job_spec(2, 4, ["fast"]),
        "status": status,
    }


def test_a_queued_job_shows_why_it_waits() -> None:
    status = {
        "phase": "Queued",
        "conditions": [
            {
                "type": "Placed",
                "status": "False",
                "reason": "WaitingForGPUs",
                "message": "needs 2 GPUs at once (gpus.min); class fast: 0 of 2 GPUs free",
                "lastTransitionTime": "2030-01-01T00:00:05Z",
            }
        ],
    }
    summary = job_summary(JobFacts.from_body(_job_body(status)))
    assert summary.phase is not None and summary.phase.value == "Queued"
    assert summary.message.endswith("class fast: 0 of 2 GPUs free")
    assert (summary.gpus, summary.classes, summary.epochs) == (0, "", 3)
    assert summary.created == datetime(2030, 1, 1, tzinfo=UTC)


def test_describe_shows_the_wait_per_class_from_the_status_data() -> None:
    waiting = {
        "reason": "InsufficientCapacity",
        "classes": [
            {
                "gpuClass": "fast",
                "verdict": "NoSchedulableNodes",
                "nodes": 2,
                "excluded": [
                    {"filter": "taint kwok.x-k8s.io/node=fake:NoSchedule not tolerated", "nodes": 2}
                ],
            },
            {"gpuClass": "slow", "verdict": "NotEnoughFree", "free": 1, "wanted": 2, "nodes": 1},
        ],
    }
    status = {"phase": "Queued", "waiting": waiting}
    detail = job_detail(JobFacts.from_body(_job_body(status)))
    console = Console(width=200, record=True)
    console.print(describe_job(detail))
    text = console.export_text()
    assert "Waiting (InsufficientCapacity), per GPU class" in text
    assert "no schedulable nodes (2 of 2 nodes excluded: 2 taint kwok.x-k8s.io/node=fake:NoSchedule" in text
    assert "1 of 2 GPUs free" in text


def test_an_invalid_job_lists_its_problems() -> None:
    spec = job_spec(2, 4, ["fast"])
    spec["gpus"] = {"min": 5, "max": 4}
    detail = job_detail(JobFacts.from_body(_job_body(None, spec)))
    assert detail.strategy is None and detail.problems
    assert any("gpus.min" in problem for problem in detail.problems)
    assert detail.message.startswith("invalid spec: ")


def test_pools_count_job_allocations_and_other_pods() -> None:
    running = JobRequest(
        key="ns/a",
        gpus_min=3,
        gpus_max=3,
        global_batch=30,
        created_at=0,
        current=Allocation(tuple(WorkerSlot(i, "f0", "fast") for i in range(3))),
    )
    snapshot = Snapshot(
        classes=(GPUClassInfo("slow", 0.5, 16), GPUClassInfo("fast", 1.0, 80)),
        nodes=(
            NodeInfo("f0", "fast", 4),
            NodeInfo("s0", "slow", 4, gpus_used_by_others=1),
            NodeInfo("s1", "slow", 2, schedulable=False),
        ),
        jobs=(running,),
    )
    fast, slow = pools(snapshot)
    assert fast.gpu_class == "fast" and slow.gpu_class == "slow"  # fastest first
    assert (fast.gpus_total, fast.gpus_allocated, fast.gpus_free) == (4, 3, 1)
    assert (slow.gpus_total, slow.gpus_allocated, slow.gpus_free) == (6, 1, 3)
    assert [(n.name, n.schedulable, n.gpus_free) for n in slow.nodes] == [("s0", True, 3), ("s1", False, 0)]


def _pod(name: str, generation: int, rank: int, uid: str = "0123456789abcdef") -> dict[str, Any]:
    labels = {"heterotrain.io/job": "train", "heterotrain.io/generation": str(generation)}
    labels["heterotrain.io/rank"] = str(rank)
    return {"metadata": {"name": name, "namespace": "team", "uid": uid, "labels": labels}}


def test_logs_read_the_newest_generation_by_rank() -> None:
    pods = [_pod("a-g0-w0", 0, 0), _pod("a-g1-w1", 1, 1), _pod("a-g1-w0", 1, 0)]
    assert [p["metadata"]["name"] for p in worker_pods(pods, None)] == ["a-g1-w0", "a-g1-w1"]
    assert [p["metadata"]["name"] for p in worker_pods(pods, 1)] == ["a-g1-w1"]
    assert worker_pods(pods, 5) == [] and worker_pods([], None) == []
    path = local_log_path(Path("/bed/local-pods"), _pod("a-g1-w0", 1, 0))
    assert path == Path("/bed/local-pods/pods/team/a-g1-w0-01234567/container.log")


def test_whatif_reads_a_manifest_or_a_bare_spec() -> None:
    manifest = {"kind": "HeteroTrainJob", "metadata": {"name": "big", "namespace": "ml"}, "spec": job_spec(2)}
    assert (what_if_request(manifest, None).namespace, what_if_request(manifest, None).name) == ("ml", "big")
    assert what_if_request(manifest, "other").namespace == "other"
    bare = what_if_request(job_spec(2), None, fallback_namespace="mine")
    assert (bare.namespace, bare.name) == ("mine", "what-if")
    broken = job_spec(2)
    del broken["batch"]
    try:
        what_if_request(broken, None)
    except ValueError as error:
        assert "spec.batch" in str(error)
    else:
        raise AssertionError("a spec without batch must be refused")


def test_age_reads_like_kubectl() -> None:
    now = datetime(2030, 1, 2, tzinfo=UTC)
    assert age(datetime(2030, 1, 1, tzinfo=UTC), now) == "1d"
    assert age(datetime(2030, 1, 1, 23, 59, 15, tzinfo=UTC), now) == "45s"
    assert age(None, now) == "-"
