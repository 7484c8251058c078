"""Two writers of status.conditions (the scheduling loop and the rebalancer) never drop each other's
conditions: each sends its own types with the other's as stored, under a resourceVersion
precondition, and reads again on a conflict."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from tests.fakekube import FakeKube
from tests.operator.builders import job_body

from hetero_operator.controller.k8s import KubeError
from hetero_operator.controller.status_writes import (
    ATTEMPTS,
    owned_by_loop,
    owned_by_rebalancer,
    patch_status,
)

PATH = "/apis/heterotrain.io/v1alpha1/namespaces/team/heterotrainjobs/train/status"


def condition(kind: str, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "Test", "message": kind, "lastTransitionTime": "t"}


def cluster(*conditions: dict[str, Any]) -> FakeKube:
    kube = FakeKube()
    body = job_body("train")
    body["status"] = {"conditions": list(conditions)}
    kube.put(body)
    return kube


def stored(kube: FakeKube) -> dict[str, str]:
    job = kube.obj("HeteroTrainJob", "team", "train")
    assert job is not None
    return {c["type"]: c["status"] for c in job["status"]["conditions"]}


def another_writer(kube: FakeKube, conditions: list[dict[str, Any]]) -> None:
    """Someone else's status write lands (the store changes under the writer's feet)."""
    job = kube.obj("HeteroTrainJob", "team", "train")
    assert job is not None
    updated = copy.deepcopy(job)
    updated["status"]["conditions"] = conditions
    kube._store(("heterotrainjobs", "team", "train"), updated)


def test_the_loop_keeps_the_rebalancers_condition_written_meanwhile() -> None:
    kube = cluster(condition("Valid"))
    known = kube.obj("HeteroTrainJob", "team", "train")  # what the loop saw before the rebalancer wrote
    another_writer(kube, [condition("Valid"), condition("MetricsAvailable", "False")])
    mine = [condition("Valid"), condition("Placed")]  # the loop's stale view has no MetricsAvailable
    asyncio.run(patch_status(kube, PATH, {"conditions": mine, "phase": "Starting"}, owned_by_loop, known))
    assert stored(kube) == {"Valid": "True", "Placed": "True", "MetricsAvailable": "False"}
    assert kube.obj("HeteroTrainJob", "team", "train")["status"]["phase"] == "Starting"  # type: ignore[index]
    assert kube.count("GET") == 1  # one conflict, one fresh read


def test_the_rebalancer_keeps_the_loops_conditions() -> None:
    kube = cluster(condition("Valid"), condition("Placed"))
    stale = [condition("MetricsAvailable")]  # built from a body without the loop's conditions
    asyncio.run(patch_status(kube, PATH, {"conditions": stale}, owned_by_rebalancer))
    assert stored(kube) == {"Valid": "True", "Placed": "True", "MetricsAvailable": "True"}


def test_a_writer_cannot_set_the_other_writers_types() -> None:
    kube = cluster(condition("MetricsAvailable"))
    asyncio.run(
        patch_status(kube, PATH, {"conditions": [condition("MetricsAvailable", "False")]}, owned_by_loop)
    )
    assert stored(kube) == {"MetricsAvailable": "True"}


def test_endless_conflicts_end_in_an_error() -> None:
    kube = cluster()
    kube.before("PATCH", "/status", lambda: another_writer(kube, [condition("MetricsAvailable")]))
    with pytest.raises(KubeError, match="409"):
        asyncio.run(patch_status(kube, PATH, {"conditions": [condition("Valid")]}, owned_by_loop))
    assert kube.count("PATCH") == ATTEMPTS


def test_patches_without_conditions_need_no_precondition() -> None:
    kube = cluster(condition("Valid"))
    kube.before(
        "PATCH", "/status", lambda: another_writer(kube, [condition("Valid"), condition("MetricsAvailable")])
    )
    asyncio.run(patch_status(kube, PATH, {"phase": "Running"}, owned_by_loop))
    assert kube.count("GET") == 0
    assert kube.obj("HeteroTrainJob", "team", "train")["status"]["phase"] == "Running"  # type: ignore[index]
    assert stored(kube) == {"Valid": "True", "MetricsAvailable": "True"}
