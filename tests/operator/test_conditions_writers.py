"""Two writers of status.conditions never drop each other's conditions."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import pytest

from hetero_operator.controller.conditions import (
    ATTEMPTS,
    owned_by_loop,
    owned_by_rebalancer,
    patch_status,
)
from hetero_operator.controller.k8s import KubeError

PATH = "/apis/heterotrain.io/v1alpha1/namespaces/team/heterotrainjobs/train/status"


def condition(kind: str, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": "Test", "message": kind, "lastTransitionTime": "t"}


class Server:
    """One job on an API server: merge patches honour a resourceVersion precondition."""

    def __init__(self, conditions: list[dict[str, Any]]) -> None:
        self.body: dict[str, Any] = {
            "metadata": {"resourceVersion": "1"},
            "status": {"conditions": conditions},
        }
        self.reads = 0
        self.before_write: list[dict[str, Any]] = []  # another writer's conditions, written first

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any] | None:
        self.reads += 1
        return copy.deepcopy(self.body)

    def _bump(self) -> None:
        self.body["metadata"]["resourceVersion"] = str(int(self.body["metadata"]["resourceVersion"]) + 1)

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> dict[str, Any] | None:
        if self.before_write:
            self.body["status"]["conditions"] = self.before_write.pop(0)["conditions"]
            self._bump()
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != self.body["metadata"]["resourceVersion"]:
            raise KubeError(409, "PATCH", path, "the object has been modified")
        self.body["status"].update(copy.deepcopy(dict(patch["status"])))
        self._bump()
        return copy.deepcopy(self.body)


def types(server: Server) -> dict[str, str]:
    return {c["type"]: c["status"] for c in server.body["status"]["conditions"]}


def test_the_loop_keeps_the_rebalancers_condition_written_meanwhile() -> None:
    server = Server([condition("Valid")])
    known = copy.deepcopy(server.body)  # what the loop saw before the rebalancer wrote
    server.before_write = [{"conditions": [condition("Valid"), condition("MetricsAvailable", "False")]}]
    loop_conditions = [
        condition("Valid"),
        condition("Placed"),
    ]  # the loop's stale view has no MetricsAvailable
    asyncio.run(
        patch_status(server, PATH, {"conditions": loop_conditions, "phase": "Starting"}, owned_by_loop, known)
    )
    assert types(server) == {"Valid": "True", "Placed": "True", "MetricsAvailable": "False"}
    assert server.body["status"]["phase"] == "Starting"
    assert server.reads == 1  # one conflict, one fresh read


def test_the_rebalancer_keeps_the_loops_conditions() -> None:
    server = Server([condition("Valid"), condition("Placed")])
    stale = [condition("MetricsAvailable")]  # built from a body without the loop's conditions
    asyncio.run(patch_status(server, PATH, {"conditions": stale}, owned_by_rebalancer))
    assert types(server) == {"Valid": "True", "Placed": "True", "MetricsAvailable": "True"}


def test_a_writer_cannot_set_the_other_writers_types() -> None:
    server = Server([condition("MetricsAvailable")])
    asyncio.run(
        patch_status(server, PATH, {"conditions": [condition("MetricsAvailable", "False")]}, owned_by_loop)
    )
    assert types(server) == {"MetricsAvailable": "True"}


def test_endless_conflicts_end_in_an_error() -> None:
    server = Server([])
    server.before_write = [{"conditions": [condition("MetricsAvailable")]}] * (ATTEMPTS + 1)
    with pytest.raises(KubeError, match="409"):
        asyncio.run(patch_status(server, PATH, {"conditions": [condition("Valid")]}, owned_by_loop))


def test_patches_without_conditions_need_no_precondition() -> None:
    server = Server([condition("Valid")])
    server.before_write = [{"conditions": [condition("Valid"), condition("MetricsAvailable")]}]
    asyncio.run(patch_status(server, PATH, {"phase": "Running"}, owned_by_loop))
    assert server.reads == 0 and server.body["status"]["phase"] == "Running"
    assert types(server) == {"Valid": "True", "MetricsAvailable": "True"}
