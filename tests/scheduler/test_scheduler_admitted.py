"""Jobs a quota system admitted on exact GPU counts per class: placed on exactly those, or waiting."""

from __future__ import annotations

from collections import Counter

import pytest
from tests.scheduler.scheduler_cases import job, nodes

from hetero_operator.resources import Strategy
from hetero_operator.scheduler import (
    GPUClassInfo,
    NodeInfo,
    Snapshot,
    SnapshotError,
    WaitCode,
    schedule,
)

CLASSES = (GPUClassInfo("fast", 1.0, 80), GPUClassInfo("slow", 0.25, 16))


def snapshot(*jobs: object, node_list: tuple[NodeInfo, ...] | None = None) -> Snapshot:
    cluster = node_list if node_list is not None else (*nodes("fast", 2, 4), *nodes("slow", 2, 4))
    return Snapshot(CLASSES, cluster, tuple(jobs))  # type: ignore[arg-type]


def test_an_admitted_job_gets_exactly_its_gpus_per_class_even_when_a_faster_mix_is_free() -> None:
    # Left to itself the scheduler would put this job on the fast GPUs alone.
    admitted = job("admitted", 3, gpus_max=8, exact_mix={"fast": 1, "slow": 2})
    decisions = schedule(snapshot(admitted))
    allocation = decisions.place["ns/admitted"]
    assert allocation.gpus_per_class() == Counter({"fast": 1, "slow": 2})
    assert decisions.grow == {}, "never grown, although GPUs sit idle"
    assert decisions.predicted_samples_per_second["ns/admitted"] > 0


def test_the_same_job_without_an_admission_takes_the_fast_gpus() -> None:
    """Control for the test above: the exact mix is what changes the placement."""
    free = job("free", 3, gpus_max=3)
    allocation = schedule(snapshot(free)).place["ns/free"]
    assert allocation.gpus_per_class() == Counter({"fast": 3})


def test_an_admitted_job_waits_for_busy_nodes_and_says_for_which_class() -> None:
    cluster = (NodeInfo("fast-0", "fast", 4, gpus_used_by_others=3), *nodes("slow", 1, 4))
    admitted = job("admitted", 2, exact_mix={"fast": 2})
    decisions = schedule(snapshot(admitted, node_list=cluster))
    assert "ns/admitted" not in decisions.place
    reason = decisions.unschedulable["ns/admitted"]
    assert reason.code is WaitCode.WAITING_FOR_GPUS
    assert "admitted on fast: 2 GPUs" in reason.message and "class fast (1 free" in reason.message
    assert [(c.gpu_class, c.free, c.wanted) for c in reason.classes] == [("fast", 1, 2)]


def test_the_gpus_an_admitted_job_takes_are_not_given_to_a_later_job() -> None:
    cluster = (*nodes("fast", 1, 4), *nodes("slow", 1, 4))
    first = job("first", 4, arrived=0.0, exact_mix={"fast": 4})
    later = job("later", 2, arrived=1.0, allowed_classes=("fast",))
    decisions = schedule(snapshot(first, later, node_list=cluster))
    assert decisions.place["ns/first"].gpus_per_class() == Counter({"fast": 4})
    assert "ns/later" not in decisions.place


def test_an_admitted_hetpipe_job_is_laid_out_in_whole_virtual_workers() -> None:
    admitted = job(
        "pipe",
        4,
        strategy=Strategy.HETPIPE,
        virtual_worker_size=2,
        exact_mix={"fast": 2, "slow": 2},
    )
    allocation = schedule(snapshot(admitted)).place["ns/pipe"]
    assert allocation.gpus_per_class() == Counter({"fast": 2, "slow": 2})
    sizes = Counter(w.virtual_worker for w in allocation.workers)
    assert sorted(sizes.values()) == [2, 2], "two virtual workers of two GPUs each"


@pytest.mark.parametrize("mix", [{}, {"fast": 0}, {"fast": 3}])
def test_an_exact_mix_must_name_whole_chunks(mix: dict[str, int]) -> None:
    with pytest.raises(SnapshotError, match="exact_mix"):
        job("bad", 4, strategy=Strategy.HETPIPE, virtual_worker_size=2, exact_mix=mix)
