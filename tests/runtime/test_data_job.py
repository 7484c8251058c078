"""data strategy end to end on 3 loopback workers with simulated speeds 1, 0.5, 0.25."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.jobs import SPEEDS, read_logs, run_job, write_plan_atomically

from hetero_operator.plan import Strategy
from hetero_runtime.checkpoint import latest_checkpoint, load
from hetero_runtime.local import LocalJob, initial_plan

EPOCHS = 5
pytestmark = pytest.mark.timeout(200)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> LocalJob:
    plan = initial_plan(Strategy.DATA, SPEEDS, 64)
    return run_job(tmp_path_factory.mktemp("uninterrupted"), plan, EPOCHS)


def final_weights(job: LocalJob) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(job.spec.checkpoint_dir)
    assert path is not None
    state = load(path)
    assert state["epochs_done"] == EPOCHS
    return state["model"]


def test_digits_reaches_90_percent_with_uneven_batches(uninterrupted: LocalJob) -> None:
    results = uninterrupted.results()
    assert [r["epochs"][0]["local_batch"] for r in results] == [37, 18, 9]  # 4:2:1 split of 64
    assert results[0]["final_evaluation"]["accuracy"] >= 0.90
    # Every rank ends each epoch with the same evaluation: the replicas never diverge.
    assert len({round(r["final_evaluation"]["accuracy"], 6) for r in results}) == 1
    # All samples of an epoch are used exactly once, split 37:18:9 (tail included).
    assert sum(r["epochs"][0]["samples"] for r in results) == 1437


def test_simulated_speed_stretches_compute_and_is_announced(uninterrupted: LocalJob) -> None:
    results = uninterrupted.results()
    per_sample = [
        sum(e["compute_seconds"] for e in r["epochs"]) / sum(e["samples"] for e in r["epochs"])
        for r in results
    ]
    # Rank 2 runs at a quarter of rank 0's speed: its per-sample compute time is clearly longer.
    assert per_sample[2] > 2.0 * per_sample[0]
    assert "SIMULATION: rank 2 runs at simulated speed 0.25" in read_logs(uninterrupted)
    assert "SIMULATION: rank 0" not in read_logs(uninterrupted)


def test_kill_mid_epoch_resumes_to_identical_weights(uninterrupted: LocalJob, tmp_path: Path) -> None:
    killed: list[int] = []

    def kill_once(job: LocalJob, progress: dict[str, Any]) -> None:
        if progress["epoch"] == 2 and not killed:
            job.kill_rank(1)
            killed.append(1)

    plan = initial_plan(Strategy.DATA, SPEEDS, 64)
    job = run_job(tmp_path, plan, EPOCHS, on_progress=kill_once)
    assert killed and job.restarts == 1
    results = job.results()
    assert all(r["resumed_from_epoch"] in (2, 3) for r in results)
    expected, got = final_weights(uninterrupted), final_weights(job)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_live_plan_applies_at_epoch_two_and_bad_plans_are_refused(tmp_path: Path) -> None:
    plan = initial_plan(Strategy.DATA, SPEEDS, 64)
    second = plan.model_copy(update={"version": 2, "apply_at_epoch": 2, "local_batches": [30, 20, 14]})

    def operator(job: LocalJob, progress: dict[str, Any]) -> None:
        if progress["epoch"] == 1:
            write_plan_atomically(job.spec.plan_file, second.to_json())
        elif progress["epoch"] == 3:
            bad = second.model_dump(mode="json") | {
                "version": 3,
                "apply_at_epoch": 3,
                "local_batches": [1, 2, 3],
            }
            write_plan_atomically(job.spec.plan_file, json.dumps(bad))

    job = run_job(tmp_path, plan, 5, on_progress=operator)
    results = job.results()
    for rank, result in enumerate(results):
        assert result["plan_history"] == [[0, 1], [2, 2]]
        batches = [epoch["local_batch"] for epoch in result["epochs"]]
        assert batches == [plan.local_batches[rank]] * 2 + [second.local_batches[rank]] * 3
    logs = read_logs(job)
    assert "applying plan version 2 at epoch 2" in logs
    assert "malformed plan" in logs and "keeping plan version 2" in logs
