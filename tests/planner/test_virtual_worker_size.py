"""The virtual-worker size the planner picks when a HetPipe spec leaves it out, against hand-computed
scores (virtual workers times the summed speed of the slowest one) and a brute force over every
grouping of the GPUs into equal virtual workers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from hetero_operator.planner.virtual_workers import Node, Policy, choose_virtual_worker_size

THREE_SPEEDS = [
    Node("fast", "fast", 1, 1.0, 80),
    Node("medium", "medium", 1, 0.5, 32),
    Node("slow", "slow", 1, 0.25, 16),
]
TWO_BY_TWO = [Node("a", "fast", 2, 1.0, 80), Node("b", "slow", 2, 0.25, 16)]


def equal_groupings(speeds: list[float], size: int) -> Iterator[list[list[float]]]:
    """Every way to split `speeds` (one per GPU) into groups of `size`."""
    if not speeds:
        yield []
        return
    head, rest = speeds[0], speeds[1:]
    for mask in range(1 << len(rest)):
        mates = [s for i, s in enumerate(rest) if mask >> i & 1]
        if len(mates) != size - 1:
            continue
        left = [s for i, s in enumerate(rest) if not mask >> i & 1]
        for tail in equal_groupings(left, size):
            yield [[head, *mates], *tail]


def brute_force_best(nodes: list[Node]) -> float:
    speeds = [n.speed for n in nodes for _ in range(n.gpus)]
    sizes = [k for k in range(1, len(speeds) + 1) if len(speeds) % k == 0]
    return max(len(g) * min(sum(vw) for vw in g) for k in sizes for g in equal_groupings(speeds, k))


def test_three_single_gpu_nodes_of_three_speeds_form_one_pipeline() -> None:
    # k=1: three workers at the slowest one's 0.25 -> 0.75; k=3: one worker of 1 + 0.5 + 0.25 = 1.75.
    chosen = choose_virtual_worker_size(THREE_SPEEDS, Policy.AUTO)
    assert [[s.node for s in vw] for vw in chosen.virtual_workers] == [["fast", "medium", "slow"]]
    assert chosen.score == pytest.approx(1.75)


def test_ties_go_to_the_shorter_pipeline() -> None:
    # k=1: 4 x 0.25 = 1; k=2 (ED): two of fast+slow, 2 x 1.25 = 2.5; k=4: one of 2.5. k=2 wins the tie.
    chosen = choose_virtual_worker_size(TWO_BY_TWO, Policy.AUTO)
    assert [len(vw) for vw in chosen.virtual_workers] == [2, 2]
    assert chosen.policy is Policy.ED
    assert chosen.score == pytest.approx(2.5)


def test_identical_gpus_stay_data_parallel() -> None:
    nodes = [Node(f"n{i}", "fast", 1, 1.0, 80) for i in range(4)]
    chosen = choose_virtual_worker_size(nodes, Policy.AUTO)
    assert [len(vw) for vw in chosen.virtual_workers] == [1, 1, 1, 1]


@pytest.mark.parametrize("nodes", [THREE_SPEEDS, TWO_BY_TWO], ids=["three-speeds", "two-by-two"])
def test_the_chosen_size_scores_as_well_as_any_equal_grouping(nodes: list[Node]) -> None:
    assert choose_virtual_worker_size(nodes, Policy.AUTO).score == pytest.approx(brute_force_best(nodes))
