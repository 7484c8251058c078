"""Total batch by goodput, gradient-noise scale estimates, learning-rate scaling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from planner_cases import three_gpu_cluster

from hetero_operator.planner.goodput import (
    LrScaling,
    choose_global_batch,
    efficiency,
    geometric_candidates,
    goodput_table,
    lr_factor,
    noise_scale_estimates,
    theorem_weights,
)

CANDIDATES = [64, 96, 128, 192, 256, 384, 512, 768, 1024]
EXPECTED = {  # B: (OptPerf ms, efficiency, goodput)
    64: (61.6720, 1.0, 1.0377),
    96: (67.0480, 0.9355, 1.3394),
    128: (72.4240, 0.8788, 1.5531),
    192: (83.8870, 0.7838, 1.7939),
    256: (103.8960, 0.7073, 1.7428),
    384: (146.9040, 0.5918, 1.5470),
    512: (189.9120, 0.5088, 1.3716),
    768: (275.9280, 0.3973, 1.1057),
    1024: (361.9440, 0.3258, 0.9219),
}


def test_goodput_table_and_choice() -> None:
    cl = three_gpu_cluster()
    for point in goodput_table(cl, CANDIDATES, noise_scale=400, base_batch=64):
        perf, eff, good = EXPECTED[point.global_batch]
        assert point.opt_perf_ms == pytest.approx(perf, abs=1e-4)
        assert point.efficiency == pytest.approx(eff, abs=1e-4)
        assert point.goodput == pytest.approx(good, abs=1e-4)
    assert choose_global_batch(cl, CANDIDATES, 400, 64).global_batch == 192


def test_geometric_candidates_cover_the_range() -> None:
    values = geometric_candidates(64, 1024, 50)
    assert values[0] == 64 and values[-1] == 1024
    assert values == sorted(set(values))
    assert efficiency(64, 400, 64) == 1.0


def test_theorem_weights_match_the_checked_values() -> None:
    w_g, w_s = theorem_weights([72, 36, 20])
    assert w_g == pytest.approx([-0.09042, 0.125027, 0.965393], abs=1e-5)
    assert w_s == pytest.approx([0.056441, 0.273989, 0.669571], abs=1e-5)
    equal_g, equal_s = theorem_weights([32, 32, 32, 32])
    assert equal_g == pytest.approx([0.25] * 4) and equal_s == pytest.approx([0.25] * 4)


def test_noise_scale_estimates() -> None:
    g, s = noise_scale_estimates([72, 36, 20], [1.9, 2.8, 4.2], 1.5)
    assert (g, s) == pytest.approx((0.99375, 64.8), abs=1e-6)
    assert s / g == pytest.approx(65.207547, abs=1e-6)
    g_p, s_p = noise_scale_estimates([72, 36, 20], [1.9, 2.8, 4.2], 1.5, paper_weights=True)
    assert (g_p, s_p) == pytest.approx((1.000205, 64.408167), abs=1e-6)


def test_noise_scale_estimates_are_unbiased_on_synthetic_gradients() -> None:
    rng = np.random.default_rng(3)
    dim, batches = 64, [72, 36, 20]
    true_g = np.zeros(dim)
    true_g[0] = 1.0  # |G|^2 = 1, tr(Sigma) = 64 with unit per-coordinate noise
    gs, ss = [], []
    for _ in range(4000):
        locals_ = [true_g + rng.normal(0, 1, dim) / math.sqrt(b) for b in batches]
        total = sum(batches)
        global_ = sum(b * v for b, v in zip(batches, locals_, strict=True)) / total
        g, s = noise_scale_estimates(batches, [float(v @ v) for v in locals_], float(global_ @ global_))
        gs.append(g)
        ss.append(s)
    assert np.mean(gs) == pytest.approx(1.0, abs=0.02)
    assert np.mean(ss) == pytest.approx(64.0, abs=1.0)


def test_lr_scaling_rules() -> None:
    assert lr_factor(LrScaling.SQRT, 256, 64) == pytest.approx(2.0)
    # AdaScale: pure signal -> no scaling; pure noise -> linear scaling.
    assert lr_factor(LrScaling.ADASCALE, 256, 64, var=0.0, sqr=1.0) == pytest.approx(1.0)
    assert lr_factor(LrScaling.ADASCALE, 256, 64, var=1.0, sqr=0.0) == pytest.approx(4.0)
    assert lr_factor(LrScaling.ADASCALE, 256, 64, var=1.0, sqr=1.0) == pytest.approx(2 / 1.25)
    assert lr_factor(LrScaling.NONE, 256, 64) == 1.0
