"""data strategy end to end on 3 loopback workers with simulated speeds 1, 0.5, 0.25.

Both jobs below act as the operator too: after epoch 1 they publish plan version 2 (to apply at
epoch 2, with another split), after epoch 3 a malformed version 3. The second job also loses a
worker mid-run and must resume from its checkpoint to exactly the weights of the first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.jobs import SPEEDS, read_logs, run_job, write_plan_atomically

from hetero_operator.plan import Plan, Strategy
from hetero_runtime.checkpoint import latest_checkpoint, load
from hetero_runtime.local import LocalJob, initial_plan

EPOCHS = 5
FIRST = initial_plan(Strategy.DATA, SPEEDS, 64)
SECOND = FIRST.model_copy(update={"version": 2, "apply_at_epoch": 2, "local_batches": [30, 20, 14]})
pytestmark = [pytest.mark.ranks, pytest.mark.timeout(200)]


def act_as_operator(job: LocalJob, progress: dict[str, Any]) -> None:
    if progress["epoch"] == 1:
        write_plan_atomically(job.spec.plan_file, SECOND.to_json())
    elif progress["epoch"] == 3:
        bad = SECOND.model_dump(mode="json") | {"version": 3, "apply_at_epoch": 3, "local_batches": [1, 2, 3]}
        write_plan_atomically(job.spec.plan_file, json.dumps(bad))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> LocalJob:
    return run_job(tmp_path_factory.mktemp("uninterrupted"), FIRST, EPOCHS, on_progress=act_as_operator)


def final_weights(job: LocalJob) -> dict[str, torch.Tensor]:
    path = latest_checkpoint(job.spec.checkpoint_dir)
    assert path is not None
    state = load(path)
    assert state["epochs_done"] == EPOCHS
    assert Plan.from_json(state["plan"]).version == 2
    return state["model"]


def test_digits_reaches_90_percent_with_uneven_batches(uninterrupted: LocalJob) -> None:
    results = uninterrupted.results()
    assert [r["epochs"][0]["local_batch"] for r in results] == [37, 18, 9]  # 4:2:1 split of 64
    assert results[0]["final_evaluation"]["accuracy"] >= 0.90
    # Every rank ends each epoch with the same evaluation: the replicas never diverge.
    assert len({round(r["final_evaluation"]["accuracy"], 6) for r in results}) == 1
    # All samples of an epoch are used exactly once, tail included.
    assert all(sum(r["epochs"][e]["samples"] for r in results) == 1437 for e in range(EPOCHS))
    # What every rank reports the epoch covered is that sum, not steps x 64 (the last step is short).
    assert all(r["epochs"][e]["global_samples"] == 1437 for r in results for e in range(EPOCHS))
    assert results[0]["epochs"][0]["steps"] * 64 > 1437
    assert all("gradient_noise_scale" in e["extra"] for e in results[0]["epochs"])


def test_live_plan_applies_at_epoch_two_and_bad_plans_are_refused(uninterrupted: LocalJob) -> None:
    for rank, result in enumerate(uninterrupted.results()):
        assert result["plan_history"] == [[0, 1], [2, 2]]
        batches = [epoch["local_batch"] for epoch in result["epochs"]]
        assert batches == [FIRST.local_batches[rank]] * 2 + [SECOND.local_batches[rank]] * 3
    logs = read_logs(uninterrupted)
    assert "applying plan version 2 at epoch 2" in logs
    assert "malformed plan" in logs and "keeping plan version 2" in logs


def test_simulated_speed_stretches_compute_and_is_announced(uninterrupted: LocalJob) -> None:
    results = uninterrupted.results()
    epochs = [r["epochs"][:2] for r in results]  # plan 1: batches 37, 18, 9
    per_sample = [
        sum(e["compute_seconds"] for e in rank) / sum(e["samples"] for e in rank) for rank in epochs
    ]
    # Rank 2 runs at a quarter of rank 0's speed: its per-sample compute time is clearly longer.
    assert per_sample[2] > 2.0 * per_sample[0]
    logs = read_logs(uninterrupted)
    assert "SIMULATION: rank 2 runs at simulated speed 0.25" in logs
    # Speed 1 is paced too: to the base device every rank calibrated, one at a time, at start.
    assert "SIMULATION: rank 0 runs at simulated speed 1" in logs
    assert logs.count("calibrated solo") == 3
    costs = [r["simulated_costs"] for r in results]
    assert costs[0]["step"] > 0 and costs[0] == costs[1] == costs[2]


def test_kill_mid_epoch_resumes_to_identical_weights(uninterrupted: LocalJob, tmp_path: Path) -> None:
    killed: list[int] = []

    def operate_and_kill(job: LocalJob, progress: dict[str, Any]) -> None:
        act_as_operator(job, progress)
        if progress["epoch"] == 2 and not killed:
            job.kill_rank(1)
            killed.append(1)

    job = run_job(tmp_path, FIRST, EPOCHS, on_progress=operate_and_kill)
    assert killed and job.restarts == 1
    results = job.results()
    assert all(r["resumed_from_epoch"] == 2 for r in results)
    assert all(r["plan_history"] == [[0, 1], [2, 2]] for r in results)
    expected, got = final_weights(uninterrupted), final_weights(job)
    assert expected.keys() == got.keys()
    for name in expected:
        assert torch.equal(expected[name], got[name]), name


def test_resumes_on_a_different_world_size(uninterrupted: LocalJob, tmp_path: Path) -> None:
    """A checkpoint from 3 workers continues on 2 under a plan for 2; samples stay exact."""
    three = latest_checkpoint(uninterrupted.spec.checkpoint_dir)
    assert three is not None
    source = three.parent / "checkpoint-epoch-000003.pt"
    (tmp_path / "checkpoints").mkdir(parents=True)
    (tmp_path / "checkpoints" / source.name).write_bytes(source.read_bytes())
    two = initial_plan(Strategy.DATA, [1.0, 0.5], 64, version=7)
    job = run_job(tmp_path, two, EPOCHS, speeds=[1.0, 0.5])
    results = job.results()
    assert all(r["resumed_from_epoch"] == 3 and r["world_size"] == 2 for r in results)
    assert [len(r["epochs"]) for r in results] == [2, 2]
    assert [r["epochs"][0]["local_batch"] for r in results] == [43, 21]
    assert all(sum(r["epochs"][e]["samples"] for r in results) == 1437 for e in range(2))
    assert results[0]["plan_history"] == [[0, 1], [2, 2], [3, 7]]
    assert results[0]["final_evaluation"]["accuracy"] >= 0.90
