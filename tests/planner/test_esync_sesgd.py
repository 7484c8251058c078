"""ESync local step counts and SESGD group schedules."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_operator.planner.errors import PlanningError
from hetero_operator.planner.esync import idle_ms, local_steps
from hetero_operator.planner.sesgd import (
    SplitMix64,
    group_schedule,
    mixing_probability,
    ring_allreduce_ms,
    ring_position,
)


def test_esync_margin_decides_exact_multiples() -> None:
    assert local_steps([100, 250, 500], 1) == [4, 1, 1]
    assert idle_ms([100, 250, 500], [4, 1, 1]) == pytest.approx([100, 250, 0])
    assert local_steps([30, 800, 1500, 3500], 1) == [116, 4, 2, 1]
    assert local_steps([0.1, 0.25, 0.5], 0) == [5, 2, 1]  # exact arithmetic, no float boundary error


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0.01, 1000.0), min_size=1, max_size=8), st.floats(0.0, 5.0))
def test_esync_everyone_finishes_before_the_slowest(steps_ms: list[float], eps: float) -> None:
    n = local_steps(steps_ms, eps)
    slowest = max(steps_ms)
    assert all(x >= 1 for x in n)
    assert n[steps_ms.index(slowest)] == 1
    for c, k in zip(steps_ms, n, strict=True):
        if k > 1:  # a device that took extra steps still ends epsilon before the slowest ...
            assert c * k <= slowest - eps + 1e-9
        assert c * (k + 1) > slowest - eps - 1e-9  # ... and one more step would not fit


def test_splitmix64_reference_values() -> None:
    rng = SplitMix64(0)
    assert [rng.next() for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


def test_sesgd_pairs_schedule() -> None:
    groups = group_schedule(8, 4, 42, 6)
    assert groups[0] == [[3, 1], [6, 2], [4, 0], [7, 5]]
    assert groups[5] == [[7, 6], [1, 0], [4, 5], [2, 3]]
    x = [Fraction(i) for i in range(8)]
    for step in groups:
        for g in step:
            mean = sum(x[r] for r in g) / len(g)
            for r in g:
                x[r] = mean
    assert sum(x) / 8 == Fraction(7, 2)
    expected = ["59/16", "59/16", "53/16", "53/16", "13/4", "13/4", "15/4", "15/4"]
    assert x == [Fraction(v) for v in expected]


def test_sesgd_two_groups_mix_in_two_steps() -> None:
    groups = group_schedule(8, 2, 42, 2)
    assert groups == [[[3, 1, 6, 2], [4, 0, 7, 5]], [[0, 1, 3, 7], [5, 2, 6, 4]]]


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([(4, 2), (8, 4), (12, 3), (16, 4), (6, 1)]), st.integers(0, 2**64 - 1))
def test_sesgd_groups_partition_the_ranks(nk: tuple[int, int], seed: int) -> None:
    n, k = nk
    for step in group_schedule(n, k, seed, 5):
        assert len(step) == k and all(len(g) == n // k for g in step)
        assert sorted(r for g in step for r in g) == list(range(n))
    assert group_schedule(n, k, seed, 5) == group_schedule(n, k, seed, 5)  # every rank agrees


def test_ring_neighbours_and_latency_model() -> None:
    pos = ring_position([[3, 1, 6, 2], [4, 0, 7, 5]], 6)
    assert (pos.group, pos.position, pos.send_to, pos.receive_from) == (0, 2, 2, 1)
    assert mixing_probability(8, 4) == Fraction(6, 7)
    assert mixing_probability(16, 4) == Fraction(4, 5)
    # 4 MB at 1 Gbps (0.125 MB/ms): ring of 16 vs groups of 4.
    assert ring_allreduce_ms(16, 4.0, 0.125, 0.1) == pytest.approx(63.0)
    assert ring_allreduce_ms(4, 4.0, 0.125, 5.0) == pytest.approx(78.0)


def test_sesgd_rejects_uneven_groups() -> None:
    with pytest.raises(PlanningError, match="k"):
        group_schedule(8, 3, 1, 1)
