"""Bring your own training script: a plain DDP script runs unmodified under `heterotrain worker --`;
its port (hetero_runtime.wrap) trains on uneven, re-planned splits to what one process reaches, its
own scheduler, GradScaler and checkpoints survive a restart, and its gradients are the full batch's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.jobs import SPEEDS, read_logs, write_plan_atomically
from tests.runtime.spawn import run_ranks

import hetero_runtime.examples.ddp_digits as plain_example
import hetero_runtime.examples.ddp_digits_hetero as ported_example
from hetero_operator.plan import Plan, Strategy
from hetero_runtime.local import LocalJob, LocalJobSpec, initial_plan

PLAIN = str(Path(plain_example.__file__))
PORTED = str(Path(ported_example.__file__))
EPOCHS = 4
FIRST = initial_plan(Strategy.DATA, SPEEDS, 64)
SECOND = FIRST.model_copy(update={"version": 2, "apply_at_epoch": 2, "local_batches": [30, 20, 14]})
TRAIN_SAMPLES = 1437
pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


def run_script(
    work_dir: Path,
    script: str,
    args: list[str],
    plan: Plan,
    speeds: list[float],
    on_progress: Any = None,
) -> LocalJob:
    """The script on len(speeds) local ranks, each started as `heterotrain worker -- python SCRIPT`."""
    spec = LocalJobSpec(
        target=Path(script).stem,
        speeds=speeds,
        work_dir=work_dir,
        plan=plan,
        max_restarts=0,
        command=[sys.executable, script, *args],
    )
    job: LocalJob

    def forward(payload: dict[str, Any]) -> None:
        if on_progress is not None:
            on_progress(job, payload)

    job = LocalJob(spec, on_progress=forward)
    code = job.run(200)
    logs = "\n".join(spec.log_file(r).read_text()[-3000:] for r in range(spec.workers))
    assert code == 0, f"job failed with {code}; logs:\n{logs}"
    return job


def one_process(script: str, args: list[str]) -> None:
    """The same script alone: one rank, no plan source, so the whole batch of 64 on one process."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("HETEROTRAIN_")}
    env.update({"RANK": "0", "WORLD_SIZE": "1", "OMP_NUM_THREADS": "1"})
    done = subprocess.run(
        [sys.executable, "-m", "hetero_operator", "worker", "--", sys.executable, script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_unmodified_ddp_script_runs_under_the_worker_command(tmp_path: Path) -> None:
    out = tmp_path / "plain.json"
    run_script(
        tmp_path,
        PLAIN,
        ["--epochs", "2", "--out", str(out)],
        FIRST.model_copy(update={"world_size": 2, "local_batches": [32, 32]}),
        [1.0, 1.0],
    )
    metrics = json.loads(out.read_text())
    # It read LOCAL_RANK and LOCAL_WORLD_SIZE (as torchrun sets them) and joined a world of two.
    assert metrics["world_size"] == 2
    assert metrics["accuracy"] > 0.8


def run_replanned(work: Path, script: str) -> LocalJob:
    """`script` for EPOCHS epochs on three speeds, from FIRST; SECOND is written once epoch 1 is done
    (as the operator writes a new plan), to apply from epoch 2. Its metrics go to work/out.json."""

    def act_as_operator(job: LocalJob, progress: dict[str, Any]) -> None:
        if progress["epoch"] == 1:
            write_plan_atomically(job.spec.plan_file, SECOND.to_json())

    args = ["--epochs", str(EPOCHS), "--out", str(work / "out.json")]
    return run_script(work, script, args, FIRST, SPEEDS, on_progress=act_as_operator)


@pytest.fixture(scope="module")
def ported(tmp_path_factory: pytest.TempPathFactory) -> LocalJob:
    return run_replanned(tmp_path_factory.mktemp("ported"), PORTED)


def assert_matches_one_process(job: LocalJob, script: str, work: Path) -> None:
    """The script alone in one process reaches 0.9, and the three ranks of `job` within a point of it."""
    one_process(script, ["--epochs", str(EPOCHS), "--out", str(work / "one.json")])
    alone = json.loads((work / "one.json").read_text())
    together = json.loads((job.spec.work_dir / "out.json").read_text())
    assert together["world_size"] == 3 and alone["world_size"] == 1
    assert alone["accuracy"] >= 0.9
    assert abs(together["accuracy"] - alone["accuracy"]) <= 0.01


def test_port_on_three_speeds_matches_one_process(ported: LocalJob, tmp_path: Path) -> None:
    assert_matches_one_process(ported, PORTED, tmp_path)


def test_plan_changes_between_epochs_without_a_restart(ported: LocalJob) -> None:
    results = ported.results()
    assert ported.restarts == 0
    for rank, result in enumerate(results):
        assert result["plan_history"] == [[0, 1], [2, 2]]
        batches = [epoch["local_batch"] for epoch in result["epochs"]]
        assert batches == [FIRST.local_batches[rank]] * 2 + [SECOND.local_batches[rank]] * 2
    # Every sample of every epoch is trained on exactly once, over the ranks.
    assert all(sum(r["epochs"][e]["samples"] for r in results) == TRAIN_SAMPLES for e in range(EPOCHS))
    # ... and each rank's record of what the epoch covered together says as much.
    assert all(r["epochs"][e]["global_samples"] == TRAIN_SAMPLES for r in results for e in range(EPOCHS))
    assert all("gradient_noise_scale" in epoch["extra"] for epoch in results[0]["epochs"])
    logs = read_logs(ported)
    assert "SIMULATION: rank 2 runs at simulated speed 0.25" in logs
    # The slow ranks take smaller shares: per sample, each rank's share follows the plan.
    assert (
        results[0]["epochs"][0]["samples"]
        > results[1]["epochs"][0]["samples"]
        > results[2]["epochs"][0]["samples"]
    )


def test_scheduler_scaler_and_weights_survive_a_restart(tmp_path: Path) -> None:
    """Two ranks with AMP, clipping and a StepLR: four epochs straight, against one epoch, a stop and
    a restart from the script's own checkpoint (which now holds the loader too)."""
    plan = Plan(version=1, world_size=2, global_batch=64, local_batches=[40, 24])
    speeds = [1.0, 1.0]

    def run(work: Path, epochs: int) -> dict[str, Any]:
        out = work / f"out-{epochs}.json"
        args = ["--amp", "--epochs", str(epochs), "--checkpoint-dir", str(work / "own"), "--out", str(out)]
        run_script(work, PORTED, args, plan, speeds)
        return {**json.loads(out.read_text()), "model": torch.load(work / "own" / "last.pt")["model"]}

    straight = run(tmp_path / "straight", EPOCHS)
    run(tmp_path / "restarted", 1)
    resumed = run(tmp_path / "restarted", EPOCHS)
    # The expectation is the uninterrupted run; the scaler grew past its initial scale (2**10) and the
    # scheduler decayed twice, so a state lost on restart would show.
    assert straight["scale"] > 2.0**10 and straight["lr"] == pytest.approx(0.1 * 0.7**2)
    assert resumed["scale"] == straight["scale"]
    assert resumed["lr"] == straight["lr"]
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def test_uneven_local_batches_give_the_full_batch_gradient(tmp_path: Path) -> None:
    plan = Plan(version=1, world_size=3, global_batch=70, local_batches=[40, 21, 9])
    (tmp_path / "plan.json").write_text(plan.to_json())
    results = run_ranks(
        "byos_grad.py", 3, tmp_path, extra_env={"HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json")}
    )
    assert [r["planned_batch"] for r in results] == [40, 21, 9]
    for result in results:
        # Two steps in each of 6 epochs, two of them under no_sync().
        assert result["synchronized_steps"] == 10 and result["noise_measured"]
        tolerance = 1e-5 * result["gradient_scale"]
        # Gradients set to None, then accumulated, then zeroed in place; then accumulated under
        # no_sync() over steps of different splits, and across an epoch after a synchronised step.
        for epoch in ("epoch_0", "epoch_1", "epoch_2", "epoch_3", "epoch_4", "epoch_5"):
            assert result[epoch]["max_abs_diff"] < tolerance, (epoch, result)
        # The noise scale's inputs: every rank's |g_i|² and the step's |g|², against float64 references.
        assert result["local_sq_diff"] < 1e-5 and result["global_sq_diff"] < 1e-5, result
    # The one-sample last step falls to rank 0; ranks 1 and 2 compute on a stand-in sample.
    assert [r["epoch_0"]["batch_lengths"] for r in results] == [[40, 1], [21, 1], [9, 1]]


def test_every_rank_holds_rank_zeros_batch_norm_statistics_at_each_forward(tmp_path: Path) -> None:
    plan = Plan(version=1, world_size=3, global_batch=70, local_batches=[40, 21, 9])
    (tmp_path / "plan.json").write_text(plan.to_json())
    results = run_ranks(
        "byos_buffers.py", 3, tmp_path, extra_env={"HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json")}
    )
    assert [r["planned_batch"] for r in results] == [40, 21, 9]
    ranks = results[0]["ranks"]
    synced, control = [r["synced"] for r in ranks], [r["control"] for r in ranks]
    forwards = len(synced[0])
    assert forwards == 4
    # With the broadcast every rank starts each forward from rank 0's statistics, except the no_sync()
    # pass (the third forward), which starts from its own; without it they part after one step.
    for index in range(forwards):
        if index == 2:
            assert synced[1][index] != synced[0][index]
        else:
            assert synced[1][index] == synced[0][index] and synced[2][index] == synced[0][index], index
    assert control[1][1] != control[0][1] and control[2][1] != control[0][1]


def test_run_local_runs_a_script_of_your_own(tmp_path: Path) -> None:
    command = ["run-local", "--workers", "2", "--speeds", "1,0.5", "--work-dir", str(tmp_path)]
    script = ["--", sys.executable, PORTED, "--epochs", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "hetero_operator", *command, *script],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads((tmp_path / "results" / f"rank-{r}.json").read_text()) for r in range(2)]
    # The speeds' proportional split of 64 (2:1), as the plan run-local writes gives it.
    assert [r["epochs"][0]["local_batch"] for r in results] == [43, 21]
    assert sum(r["epochs"][0]["samples"] for r in results) == TRAIN_SAMPLES


def test_the_resnet18_port_learns_on_three_speeds(tmp_path: Path) -> None:
    """torchvision's ResNet-18 (batch norm in every block) through the port on uneven shares of 37, 18
    and 9 samples. Chance is 0.1; the same script in one process reaches about 0.9 in as many epochs."""
    args = ["--model", "resnet18", "--epochs", "4", "--out", str(tmp_path / "out.json")]
    job = run_script(tmp_path, PORTED, args, FIRST, SPEEDS)
    together = json.loads((tmp_path / "out.json").read_text())
    print(together, [r["epochs"][-1]["wall_seconds"] for r in job.results()])
    assert together["world_size"] == 3
    assert together["accuracy"] >= 0.85
