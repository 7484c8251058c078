"""HeteroDataLoader over an IterableDataset: each rank its planned share of every global batch, a new
plan at an epoch boundary, a resume by position, and refusals for what cannot be split."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

from hetero_operator.plan import Plan
from hetero_runtime.wrap.stream import stream_steps

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(120)]


def test_each_rank_keeps_its_slice_of_every_global_batch() -> None:
    steps = list(stream_steps(range(22), 0, [5, 3, 2], rank=1))
    assert [s.sizes for s in steps] == [[5, 3, 2], [5, 3, 2], [1, 1, 0]]
    assert [s.samples for s in steps] == [[5, 6, 7], [15, 16, 17], [21]]
    # Rank 2 has nothing in the short last batch: it computes on a stand-in (counted zero).
    last = list(stream_steps(range(22), 0, [5, 3, 2], rank=2))[-1]
    assert last.sizes[2] == 0 and last.samples == [20]


def test_a_resumed_stream_skips_what_was_consumed() -> None:
    whole = [s.samples for s in stream_steps(range(22), 0, [5, 3, 2], rank=0)]
    resumed = [s.samples for s in stream_steps(range(22), 10, [5, 3, 2], rank=0)]
    assert resumed == whole[1:]


def test_three_ranks_share_a_stream_by_plan_and_get_the_full_batch_gradient(tmp_path: Path) -> None:
    plan = Plan(version=1, world_size=3, global_batch=20, local_batches=[10, 6, 4])
    (tmp_path / "plan.json").write_text(plan.to_json())
    results = run_ranks(
        "byos_stream.py", 3, tmp_path, extra_env={"HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json")}
    )
    for epoch, planned in enumerate(([10, 6, 4], [4, 6, 10])):
        per_rank = [r["epochs"][epoch]["steps"] for r in results]
        # The plan in force at the epoch's start, re-split without a restart; the short tail of 11
        # samples split in the plan's proportions.
        assert [s["sizes"] for s in per_rank[0]] == [planned] * 3 + [per_rank[0][3]["sizes"]]
        assert sum(per_rank[0][3]["sizes"]) == 11
        got = sorted(n for steps in per_rank for step in steps for n in step["own"])
        assert got == list(range(71)), "every sample once per epoch, by exactly one rank"
        for rank, steps in enumerate(per_rank):
            assert [len(step["own"]) for step in steps] == [s["sizes"][rank] for s in per_rank[0]]
            assert results[rank]["epochs"][epoch]["relative_grad_error"] < 1e-5
