"""Before the first cycle the operator waits for the valid HeteroQueues too; a cluster without the
HeteroQueue CRD simply has none."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from tests.operator.test_queue_status import queue

from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.k8s import KubeError
from hetero_operator.controller.startup import Existing, existing_objects, holds_everything


class _Client:
    def __init__(self, queues: list[dict[str, Any]] | None) -> None:
        self.queues = queues

    async def list_items(self, path: str, params: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        if path.endswith("/heteroqueues"):
            if self.queues is None:
                raise KubeError(404, "GET", path, "the server could not find the requested resource")
            return self.queues
        return []


def _manifest(name: str, weight: object) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroQueue",
        "metadata": {"name": name},
        "spec": {"weight": weight},
    }


def test_valid_queues_are_awaited_and_a_missing_crd_means_none() -> None:
    found = asyncio.run(existing_objects(_Client([_manifest("a", 1), _manifest("bad", 0)]), ()))  # type: ignore[arg-type]
    assert found.queues == {"a"}  # the invalid one is never indexed, so never awaited
    assert asyncio.run(existing_objects(_Client(None), ())).queues == set()  # type: ignore[arg-type]
    empty = ClusterView.build([], [], [], [])
    assert not holds_everything(empty, Existing(set(), set(), set(), queues={"a"}))
    with_queue = ClusterView.build([], [], [], [], queues=[queue("a", 1)])
    assert holds_everything(with_queue, Existing(set(), set(), set(), queues={"a"}))
