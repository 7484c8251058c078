"""Whole jobs on the GPU: every strategy trains on the device, and a checkpoint written from the device
loads back (weights only) and resumes.

On a machine with 3 or more GPUs each strategy runs on 3 workers, rank r on cuda:r, over NCCL. With
fewer GPUs each runs on one worker on cuda:0 (NCCL refuses two ranks on one GPU, see
test_cuda_collectives), and the `data` strategy also runs 3 workers sharing cuda:0 over gloo.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.gpu.devices import gpus
from tests.runtime.jobs import run_job

from hetero_operator.plan import Strategy
from hetero_runtime.checkpoint import checkpoint_path, latest_checkpoint, load, save_atomic
from hetero_runtime.examples.digits import build_model
from hetero_runtime.local import example_layer_costs, initial_plan

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(600)]
STRATEGIES = [Strategy.DATA, Strategy.SESGD, Strategy.ESYNC, Strategy.DREAMDDP, Strategy.HETPIPE]


def run_on_gpus(
    tmp_path: Path, strategy: Strategy, workers: int, env: dict[str, str]
) -> list[dict[str, Any]]:
    speeds = [1.0, 0.5, 0.25][:workers]
    costs = example_layer_costs("digits") if strategy is Strategy.HETPIPE else None
    plan = initial_plan(strategy, speeds, 64, layer_costs=costs)
    job = run_job(tmp_path, plan, 4, speeds=speeds, extra_env=env, timeout=400)
    return job.results()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_trains_on_the_device(tmp_path: Path, strategy: Strategy) -> None:
    workers = 3 if gpus() >= 3 else 1
    results = run_on_gpus(tmp_path, strategy, workers, {"HETEROTRAIN_DEVICE": "auto"})
    assert [r["device"] for r in results] == [f"cuda:{rank}" for rank in range(workers)]
    assert results[0]["final_evaluation"]["accuracy"] >= 0.9


def test_data_workers_sharing_one_gpu_over_gloo(tmp_path: Path) -> None:
    env = {"HETEROTRAIN_DEVICE": "cuda:0", "HETEROTRAIN_DIST_BACKEND": "gloo"}
    results = run_on_gpus(tmp_path, Strategy.DATA, 3, env)
    assert [r["device"] for r in results] == ["cuda:0"] * 3
    assert len({r["final_evaluation"]["accuracy"] for r in results}) == 1
    assert results[0]["final_evaluation"]["accuracy"] >= 0.9


def test_mixed_precision_auto_follows_the_gpu(tmp_path: Path) -> None:
    results = run_on_gpus(tmp_path, Strategy.DATA, 1, {"HETEROTRAIN_DEVICE": "auto"})
    bf16 = torch.cuda.get_device_capability(0)[0] >= 8
    assert results[0]["precision"] == ("bf16" if bf16 else "fp16")
    assert results[0]["final_evaluation"]["accuracy"] >= 0.9


def test_a_checkpoint_from_the_device_loads_back_weights_only(tmp_path: Path) -> None:
    model = build_model().to("cuda:0")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 64, device="cuda:0")).sum().backward()
    optimizer.step()
    path = checkpoint_path(tmp_path, 1)
    save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epochs_done": 1}, path)
    state = load(path)
    assert all(t.device.type == "cpu" for t in state["model"].values())
    fresh = build_model().to("cuda:0")
    fresh.load_state_dict(state["model"])
    again = torch.optim.SGD(fresh.parameters(), lr=0.1, momentum=0.9)
    again.load_state_dict(state["optimizer"])
    for mine, theirs in zip(fresh.parameters(), model.parameters(), strict=True):
        assert mine.device.type == "cuda" and torch.equal(mine, theirs)
    momentum = again.state[next(iter(fresh.parameters()))]["momentum_buffer"]
    assert momentum.device.type == "cuda"


def test_a_job_resumes_on_the_device_from_its_checkpoint(tmp_path: Path) -> None:
    env = {"HETEROTRAIN_DEVICE": "auto"}
    first = run_on_gpus(tmp_path, Strategy.DATA, 1, env)
    assert latest_checkpoint(tmp_path / "checkpoints") is not None and first[0]["device"] == "cuda:0"
    job = run_job(tmp_path, initial_plan(Strategy.DATA, [1.0], 64), 6, speeds=[1.0], extra_env=env)
    resumed = job.results()[0]
    assert resumed["resumed_from_epoch"] == 4 and len(resumed["epochs"]) == 2
    assert resumed["final_evaluation"]["accuracy"] >= 0.9
