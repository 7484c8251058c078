"""Start-up waits until the watches hold what existed at start, but not for what was deleted since."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.fakekube import FakeKube, ManualClock

from hetero_operator.controller.inventory import ClusterView
from hetero_operator.controller.startup import Existing, still_there, wait_for_indexes


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "heterotrain.io/v1alpha1",
        "kind": "HeteroTrainJob",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {},
    }


def watched(*jobs: str) -> ClusterView:
    """A view whose job index holds `jobs` (the values do not matter to the wait)."""
    held: dict[str, Any] = {f"ns/{name}": object() for name in jobs}
    return ClusterView(classes={}, nodes={}, jobs=held, pods_by_job={})


def test_only_what_still_exists_is_waited_for() -> None:
    start = Existing({"ns/a", "ns/b"}, {"ns/p"}, {"n1", "n2"})
    now = Existing({"ns/a", "ns/c"}, set(), {"n1", "n2"})
    assert still_there(start, now) == Existing({"ns/a"}, set(), {"n1", "n2"})


def test_a_job_deleted_while_the_watches_started_is_not_waited_for() -> None:
    kube, clock = FakeKube(), ManualClock()
    kube.put(job("a"))
    kube.put(job("b"))
    looks = 0

    def view() -> ClusterView:
        # The watch never saw b: it was deleted right after the first listing.
        nonlocal looks
        looks += 1
        if looks == 1:
            kube.objects.pop(("heterotrainjobs", "ns", "b"))
        return watched("a")

    asyncio.run(wait_for_indexes(kube, view, ("ns",), clock, timeout=60.0))
    assert clock.monotonic() < 5.0, "waited for a job that no longer exists"


def test_a_job_that_still_exists_is_waited_for() -> None:
    kube, clock = FakeKube(), ManualClock()
    kube.put(job("a"))
    kube.put(job("b"))
    asyncio.run(wait_for_indexes(kube, lambda: watched("a"), ("ns",), clock, timeout=10.0))
    assert clock.monotonic() >= 10.0, "started before the watch held every job that exists"
