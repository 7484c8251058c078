"""Virtual-worker allocation on the four-node, four-type cluster of HetPipe."""

from __future__ import annotations

import pytest

from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.virtual_workers import (
    Node,
    Policy,
    allocate_virtual_workers,
    imbalance,
)

TESTBED = [
    Node("n0", "V", 4, 1.00, 12),
    Node("n1", "R", 4, 0.85, 24),
    Node("n2", "G", 4, 0.45, 6),
    Node("n3", "Q", 4, 0.35, 8),
]
CLASS = {n.name: n.gpu_class for n in TESTBED}


def spelled(policy: Policy) -> list[str]:
    alloc = allocate_virtual_workers(TESTBED, 4, policy)
    assert all(len(vw) == 4 for vw in alloc.virtual_workers)
    slots = [(s.node, s.gpu_index) for vw in alloc.virtual_workers for s in vw]
    assert len(slots) == len(set(slots)) == 16  # every GPU used exactly once
    return ["".join(CLASS[s.node] for s in vw) for vw in alloc.virtual_workers]


def test_policies_reproduce_the_paper_table() -> None:
    assert spelled(Policy.NP) == ["VVVV", "RRRR", "GGGG", "QQQQ"]
    assert spelled(Policy.ED) == ["VRGQ"] * 4
    assert spelled(Policy.HD) == ["VVQQ", "VVQQ", "RRGG", "RRGG"]


def test_hd_grouping_scores() -> None:
    speed = {"V": 1.0, "R": 0.85, "G": 0.45, "Q": 0.35}
    memory = {"V": 12, "R": 24, "G": 6, "Q": 8}
    compute = [2 * speed["V"] + 2 * speed["Q"], 2 * speed["R"] + 2 * speed["G"]]
    mem = [2 * memory["V"] + 2 * memory["Q"], 2 * memory["R"] + 2 * memory["G"]]
    assert imbalance(compute) == pytest.approx(0.038, abs=5e-4)
    assert imbalance(mem) == pytest.approx(0.4)


def test_auto_picks_the_highest_predicted_throughput() -> None:
    alloc = allocate_virtual_workers(TESTBED, 4, Policy.AUTO)
    # NP is held back by its QQQQ straggler; ED's identical workers beat HD's slightly uneven ones.
    assert alloc.policy is Policy.ED
    assert alloc.score == pytest.approx(4 * 2.65)
    homogeneous = [Node(f"h{i}", "A", 4, 1.0, 40) for i in range(2)]
    # Equal throughput everywhere: prefer the policy with the fewest cross-node hops.
    assert allocate_virtual_workers(homogeneous, 4, Policy.AUTO).policy is Policy.NP


def test_custom_scorer_is_used() -> None:
    prefer_single_node = allocate_virtual_workers(
        TESTBED, 4, Policy.AUTO, score=lambda vws: -max(len({s.node for s in vw}) for vw in vws)
    )
    assert prefer_single_node.policy is Policy.NP


def test_impossible_policies_explain_themselves() -> None:
    with pytest.raises(PlanningError, match="k"):
        allocate_virtual_workers(TESTBED, 3, Policy.ED)
    with pytest.raises(PlanningError, match="HD"):
        allocate_virtual_workers(TESTBED[:2], 4, Policy.HD)
    with pytest.raises(PlanningError, match="NP"):
        allocate_virtual_workers(TESTBED, 8, Policy.NP)
