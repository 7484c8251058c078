"""data: the weighted all-reduce of uneven local gradients equals the full-batch gradient;
hetpipe with Nm = 1: the pipelined forward/backward over three ranks equals the unpartitioned model's."""

from __future__ import annotations

from typing import Any

import pytest
from tests.runtime.spawn import run_ranks

pytestmark = pytest.mark.ranks


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(
        "grad_equality.py", 3, tmp_path_factory.mktemp("grads"), extra_env={"LOCAL_BATCHES": "40,21,9"}
    )


@pytest.mark.timeout(120)
def test_uneven_weighted_gradient_equals_single_process_gradient(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["max_abs_diff"] < 1e-5
        # Unweighted averaging would be measurably wrong on this split: the weighting is doing work.
        assert result["plain_average_diff"] > 1e-3
        assert result["loss"] == pytest.approx(result["full_loss"], abs=1e-5)
        assert all(norm > 0 for norm in result["local_sq_norms"])


@pytest.mark.timeout(120)
def test_pipelined_pass_with_one_minibatch_in_flight_equals_the_whole_model(
    results: list[dict[str, Any]],
) -> None:
    # Stages: rank 0 holds layer 0, rank 1 the Tanh (no parameters), rank 2 layer 2.
    assert [r["pipeline_layers_with_grads"] for r in results] == [[0], [], [2]]
    for result in results:
        assert result["pipeline_grad_max_abs_diff"] < 1e-6
    assert results[2]["pipeline_loss"] == pytest.approx(results[2]["reference_loss"], abs=1e-6)
