"""Batch split: checked examples, regimes, and brute force on small instances."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog

from hetero_operator.planner.batch import (
    ClusterModel,
    WorkerModel,
    continuous_split,
    even_split,
    optimal_split,
    predict_iteration_time,
)
from hetero_operator.planner.errors import PlanningError

# (B, OptPerf, real split, bound per worker, integer split, integer time) from the checked examples
EXAMPLES = [
    (60, 61.0, [39.166667, 17.5, 3.333333], [False, False, False], [40, 17, 3], 61.25),
    (150, 76.217391, [89.891304, 42.862319, 17.246377], [False, False, True], [90, 43, 17], 76.3),
    (201, 85.54375, [120.90625, 58.40625, 21.6875], [True, False, True], [121, 59, 21], 85.9),
    (400, 152.28, [232.133333, 114.4, 53.466667], [True, True, True], [233, 114, 53], 152.8),
]


@pytest.mark.parametrize(("total", "perf", "real", "bound", "ints", "int_time"), EXAMPLES)
def test_checked_examples(
    cluster: ClusterModel,
    total: int,
    perf: float,
    real: list[float],
    bound: list[bool],
    ints: list[int],
    int_time: float,
) -> None:
    cont = continuous_split(cluster, total)
    assert cont.opt_perf == pytest.approx(perf, abs=1e-6)
    assert cont.batches == pytest.approx(real, abs=1e-6)
    assert list(cont.compute_bound) == bound
    split = optimal_split(cluster, total)
    assert list(split.local_batches) == ints
    assert split.iteration_time == pytest.approx(int_time, abs=1e-9)


def test_slow_worker_clamped_at_zero_sets_the_time(cluster: ClusterModel) -> None:
    # The closed form would give the slow worker -3.07 samples; water-filling clamps it to 0.
    cont = continuous_split(cluster, 20)
    assert cont.opt_perf == pytest.approx(57.5, abs=1e-9)
    assert cont.batches == pytest.approx([14.722222, 5.277778, 0.0], abs=1e-6)
    split = optimal_split(cluster, 20)
    assert split.iteration_time == pytest.approx(57.5)
    assert sum(split.local_batches) == 20


def test_compute_only_toy() -> None:
    toy = ClusterModel(
        tuple(WorkerModel.from_components(0, 0, k, 0, 0.5, min_batch=0) for k in (1.0, 2.0, 4.0)), 0.0, 0.0
    )
    assert continuous_split(toy, 70).opt_perf == pytest.approx(40.0)
    assert optimal_split(toy, 70).local_batches == (40, 20, 10)
    assert predict_iteration_time(toy, even_split(70, [0] * 3, [math.inf] * 3)) == pytest.approx(92.0)


def test_regimes_over_all_totals(cluster: ClusterModel) -> None:
    regimes: dict[str, list[int]] = {"all-comm": [], "mixed": [], "all-compute": []}
    for total in range(40, 601):
        bound = continuous_split(cluster, total).compute_bound
        key = "all-compute" if all(bound) else "all-comm" if not any(bound) else "mixed"
        regimes[key].append(total)
    assert (min(regimes["all-comm"]), max(regimes["all-comm"])) == (40, 143)
    assert (min(regimes["mixed"]), max(regimes["mixed"])) == (144, 202)
    assert (min(regimes["all-compute"]), max(regimes["all-compute"])) == (203, 600)


def test_never_worse_than_even_split(cluster: ClusterModel) -> None:
    for total in range(3, 300, 7):
        even = even_split(total, [0, 0, 0], [math.inf] * 3)
        assert optimal_split(cluster, total).iteration_time <= predict_iteration_time(cluster, even) + 1e-9


def test_bounds_are_honoured_and_infeasible_totals_rejected() -> None:
    workers = tuple(
        WorkerModel.from_components(
            0.1 * (i + 1), 1, 0.2 * (i + 1), 1, 0.5, min_batch=2, max_batch=10, name=str(i)
        )
        for i in range(3)
    )
    cl = ClusterModel(workers, 1.0, 1.0)
    split = optimal_split(cl, 29)
    assert all(2 <= b <= 10 for b in split.local_batches) and sum(split.local_batches) == 29
    with pytest.raises(PlanningError, match="global_batch"):
        optimal_split(cl, 5)
    with pytest.raises(PlanningError, match="global_batch"):
        optimal_split(cl, 31)


def test_thousand_workers_split_sums_and_balances() -> None:
    rng = np.random.default_rng(7)
    workers = tuple(
        WorkerModel.from_components(*rng.uniform(0.05, 2.0, 4), 0.3, min_batch=1, max_batch=None, name=str(i))
        for i in range(1000)
    )
    cl = ClusterModel(workers, 20.0, 3.0)
    split = optimal_split(cl, 64_000)
    assert sum(split.local_batches) == 64_000
    # The integer optimum is within one sample's time of the real-valued optimum.
    slack = max(w.alpha for w in workers)
    assert (
        continuous_split(cl, 64_000).opt_perf - 1e-9
        <= split.iteration_time
        <= (continuous_split(cl, 64_000).opt_perf + slack)
    )


coef = st.floats(0.0, 3.0, allow_nan=False).map(lambda x: round(x, 2))


@st.composite
def small_clusters(draw: st.DrawFn) -> tuple[ClusterModel, int]:
    n = draw(st.integers(1, 3))
    gamma = draw(st.sampled_from([0.0, 0.25, 0.5, 1.0]))
    workers = []
    for i in range(n):
        q, s, k, m = draw(coef), draw(coef), draw(coef), draw(coef)
        q = max(q, 0.01)
        lo = draw(st.integers(0, 3))
        hi = draw(st.one_of(st.none(), st.integers(lo, lo + 15)))
        workers.append(
            WorkerModel.from_components(q, s, k, m, gamma, min_batch=lo, max_batch=hi, name=str(i))
        )
    cl = ClusterModel(tuple(workers), t_o=draw(coef) * 10, t_u=draw(coef))
    low = sum(w.min_batch for w in workers)
    high = sum(w.max_batch if w.max_batch is not None else 30 for w in workers)
    return cl, draw(st.integers(low, min(high, low + 30)))


def brute_force(cl: ClusterModel, total: int) -> float:
    ranges = [range(w.min_batch, (w.max_batch if w.max_batch is not None else total) + 1) for w in cl.workers]
    best = math.inf
    for combo in itertools.product(*ranges):
        if sum(combo) == total:
            best = min(best, predict_iteration_time(cl, combo))
    return best


@settings(max_examples=150, deadline=None)
@given(small_clusters())
def test_integer_split_matches_brute_force(case: tuple[ClusterModel, int]) -> None:
    cl, total = case
    split = optimal_split(cl, total)
    assert sum(split.local_batches) == total
    for w, b in zip(cl.workers, split.local_batches, strict=True):
        assert w.min_batch <= b <= (w.max_batch if w.max_batch is not None else total)
    assert split.iteration_time == pytest.approx(brute_force(cl, total), rel=1e-9, abs=1e-9)
    # The real-valued optimum is a lower bound on every integer split.
    assert continuous_split(cl, total).opt_perf <= split.iteration_time + 1e-9


def linear_program_optimum(cl: ClusterModel, total: int) -> float:
    """The same min-max problem solved as an LP: minimise mu over (b, mu)."""
    n = cl.size
    rows, rhs = [], []
    for i, w in enumerate(cl.workers):
        for slope, offset in ((w.alpha, w.beta), (w.alpha_sync, w.beta_sync + cl.t_o)):
            row = np.zeros(n + 1)
            row[i], row[n] = slope, -1.0
            rows.append(row)
            rhs.append(-offset)
    bounds = [(w.min_batch, w.max_batch) for w in cl.workers] + [(None, None)]
    res = linprog(
        c=[0.0] * n + [1.0],
        A_ub=np.array(rows),
        b_ub=rhs,
        A_eq=[[1.0] * n + [0.0]],
        b_eq=[total],
        bounds=bounds,
        method="highs",
    )
    assert res.status == 0
    return float(res.fun) + cl.t_u


@settings(max_examples=100, deadline=None)
@given(small_clusters())
def test_continuous_split_matches_linear_program(case: tuple[ClusterModel, int]) -> None:
    cl, total = case
    cont = continuous_split(cl, total)
    assert float(cont.batches.sum()) == pytest.approx(total, abs=1e-6)
    assert all(w.min_batch - 1e-9 <= b for w, b in zip(cl.workers, cont.batches, strict=True))
    assert cont.opt_perf == pytest.approx(linear_program_optimum(cl, total), rel=1e-7, abs=1e-7)
    assert cont.opt_perf == pytest.approx(predict_iteration_time(cl, cont.batches), rel=1e-12)
