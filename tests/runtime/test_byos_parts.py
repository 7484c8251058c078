"""The parts of bring-your-own-script that need no process group: torchrun's environment, refusals,
and heterotrain.Checkpoint resuming a one-process loop mid-epoch to the uninterrupted run's state."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import IterableDataset, TensorDataset

from hetero_operator.plan import DreamDDPParams, HetPipeParams, Plan, SESGDParams, Strategy
from hetero_runtime.device import Placement
from hetero_runtime.launcher import WorkerEnvError, parse_worker_env
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.plan_refusals import own_shuffle_refusal, strategy_refusal, unmodified_script_refusal
from hetero_runtime.precision import RankFacts
from hetero_runtime.simulate import SpeedSimulator
from hetero_runtime.stopping import StopRequests
from hetero_runtime.torchrun_env import torchrun_environment
from hetero_runtime.wrap import Checkpoint, HeteroDataLoader, HeteroModel, Session, WrapperError
from hetero_runtime.wrap.buckets import BucketedAllReduce, bucket_layout
from hetero_runtime.wrap.refusals import dataset_refusal

pytestmark = pytest.mark.ranks

POD = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "job-0.job.ns.svc", "MASTER_PORT": "29500"}


def test_a_pod_gets_torchruns_variables_for_one_worker_per_host() -> None:
    variables = torchrun_environment(parse_worker_env(POD), POD)
    assert variables["RANK"] == "3" and variables["WORLD_SIZE"] == "4"
    assert variables["LOCAL_RANK"] == "0" and variables["LOCAL_WORLD_SIZE"] == "1"
    assert variables["GROUP_RANK"] == "3" and variables["GROUP_WORLD_SIZE"] == "4"
    assert variables["MASTER_ADDR"] == "job-0.job.ns.svc" and variables["MASTER_PORT"] == "29500"
    assert "OMP_NUM_THREADS" not in variables  # one process per host: the script's threads are its own


def test_workers_sharing_a_host_get_their_local_rank_and_one_thread() -> None:
    environ = {**POD, "RANK": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}
    variables = torchrun_environment(parse_worker_env(environ), environ)
    assert variables["LOCAL_RANK"] == "2" and variables["GROUP_RANK"] == "0"
    assert variables["OMP_NUM_THREADS"] == "1"


def test_a_local_rank_outside_the_host_is_refused_by_name() -> None:
    environ = {**POD, "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}
    with pytest.raises(WorkerEnvError, match="LOCAL_WORLD_SIZE=2 must be >= 1 and above LOCAL_RANK=2"):
        torchrun_environment(parse_worker_env(environ), environ)


def test_strategies_the_wrapper_cannot_run_are_refused_with_the_fix() -> None:
    data = Plan(version=1, world_size=2, global_batch=8, local_batches=[5, 3])
    dream = data.model_copy(update={"strategy": Strategy.DREAMDDP, "dreamddp": DreamDDPParams(period=3)})
    esync = data.model_copy(update={"strategy": Strategy.ESYNC})
    assert strategy_refusal(data) is None and strategy_refusal(dream) is None
    assert strategy_refusal(esync) is None
    message = strategy_refusal(hetpipe_plan(data))
    assert message is not None
    assert "'hetpipe'" in message and "spec.parallelism.strategy: data" in message
    assert "TrainingJob" in message
    # esync draws from each rank's own shuffle: a stream cannot give one.
    assert own_shuffle_refusal(esync, indexed=True) is None
    assert own_shuffle_refusal(dream, indexed=False) is None
    stream = own_shuffle_refusal(esync, indexed=False)
    assert stream is not None and "map-style dataset" in stream and "strategy: data" in stream
    # An unmodified DDP script synchronises every step: only `data` means what it does.
    assert unmodified_script_refusal(data) is None
    unported = unmodified_script_refusal(dream)
    assert unported is not None and "hetero_runtime.wrap" in unported and "strategy: data" in unported


class Stream(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(10))


class IndexedWithoutLength:
    def __getitem__(self, index: int) -> int:
        return index


def test_datasets_the_sampler_cannot_split_are_refused_with_the_fix() -> None:
    assert dataset_refusal(TensorDataset(torch.zeros(3))) is None
    assert dataset_refusal(Stream()) is None
    workers = dataset_refusal(Stream(), num_workers=2)
    assert workers is not None and "Stream" in workers and "num_workers=0" in workers
    unsized = dataset_refusal(IndexedWithoutLength())
    assert unsized is not None and "add __len__" in unsized and "IterableDataset" in unsized
    neither = dataset_refusal(42)
    assert neither is not None and "int" in neither and "TensorDataset" in neither
    empty = dataset_refusal(TensorDataset(torch.zeros(0)))
    assert empty is not None and "empty" in empty
    with pytest.raises(WrapperError, match="num_workers=0"):
        HeteroDataLoader(Stream(), batch_size=4, num_workers=1)


def test_wrapping_before_init_names_the_missing_call() -> None:
    with pytest.raises(WrapperError, match=r"init\(\) has not been called"):
        HeteroDataLoader(TensorDataset(torch.zeros(3)), batch_size=4)
    with pytest.raises(WrapperError, match="batch_size=0"):
        HeteroDataLoader(TensorDataset(torch.zeros(3)), batch_size=0)
    with pytest.raises(WrapperError, match=r"Checkpoint\(epochs=...\).*state_dict"):
        Checkpoint(epochs=3)


def hetpipe_plan(plan: Plan) -> Plan:
    """`plan` as one pipeline of its ranks, cut after the first layer."""
    ranks = list(range(plan.world_size))
    cuts = [list(range(1, plan.world_size))]
    params = HetPipeParams(virtual_workers=[ranks], stage_boundaries=cuts)
    return plan.model_copy(update={"strategy": Strategy.HETPIPE, "hetpipe": params})


def plan_file(directory: Path, strategy: Strategy) -> Path:
    plan = Plan(
        version=4,
        strategy=Strategy.DATA if strategy is Strategy.HETPIPE else strategy,
        world_size=1,
        global_batch=8,
        local_batches=[8],
        dreamddp=DreamDDPParams(period=3) if strategy is Strategy.DREAMDDP else None,
    )
    if strategy is Strategy.HETPIPE:
        plan = hetpipe_plan(plan)
    (directory / "plan.json").write_text(plan.to_json())
    return directory / "plan.json"


def test_init_refuses_a_strategy_it_cannot_run_even_without_a_loader(tmp_path: Path) -> None:
    """A script run some other way than `heterotrain worker --` (plain python, torchrun)."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "HETEROTRAIN_PLAN_SOURCE": str(plan_file(tmp_path, Strategy.HETPIPE)),
    }
    done = subprocess.run(
        [sys.executable, "-c", "import hetero_runtime.wrap as heterotrain; heterotrain.init()"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "WrapperError" in done.stderr and "spec.parallelism.strategy: data" in done.stderr
    assert "'hetpipe'" in done.stderr


def test_worker_command_refuses_a_non_data_plan_before_running_the_script(tmp_path: Path) -> None:
    plan_file(tmp_path, Strategy.DREAMDDP)
    marker = tmp_path / "ran"
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json"),
    }
    script = f"open({str(marker)!r}, 'w')"
    done = subprocess.run(
        [sys.executable, "-m", "hetero_operator", "worker", "--", sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "runs strategy 'dreamddp'" in done.stderr and "spec.parallelism.strategy: data" in done.stderr
    assert "port the script to hetero_runtime.wrap" in done.stderr
    assert not marker.exists()


def test_buckets_take_the_last_parameters_first_and_keep_large_ones_whole() -> None:
    assert bucket_layout([4, 3, 2, 1], cap=4) == [[3, 2], [1], [0]]
    assert bucket_layout([10, 1], cap=4) == [[1], [0]]  # a parameter above the cap has its own
    assert bucket_layout([1, 1, 1], cap=100) == [[2, 1, 0]]


def test_one_rank_buckets_carry_the_riders_and_zero_the_gradients_in_place() -> None:
    layer = nn.Linear(3, 2)
    params = list(layer.parameters())
    reduce = BucketedAllReduce(params, rank=0, world=1, cap=4, first_cap=4, riders=2)
    with pytest.raises(ValueError, match="1 values for 2 rider slots"):
        reduce.begin(0.5, measure=True, riders=(1.0,))
    reduce.begin(0.5, measure=True, riders=(torch.tensor(3.0), 1.0))
    layer(torch.ones(1, 3)).sum().backward()
    expected = [p.grad.clone() * 0.5 for p in params]  # type: ignore[union-attr]
    for index in range(len(params)):
        reduce.ready(index)
    reduced = reduce.finish()
    assert reduced.riders == [3.0, 1.0]
    assert reduced.norms is not None and reduced.norms.local_sq == [
        pytest.approx(sum(float(e.square().sum()) * 4 for e in expected))
    ]
    assert all(torch.equal(p.grad, e) for p, e in zip(params, expected, strict=True))  # type: ignore[arg-type]
    views = [p.grad for p in params]
    reduce.zero_gradients()
    assert all(p.grad is v and not v.any() for p, v in zip(params, views, strict=True))  # type: ignore[union-attr]


# --- heterotrain.Checkpoint, one process (no process group needed) --------------------------------

EPOCHS = 3
STOP_AFTER_STEPS = 5  # of epoch 1: the interrupted run saves there, mid-epoch


def session(tmp_path: Path) -> Session:
    env = parse_worker_env({"HETEROTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt")})
    return Session(
        env,
        Placement(torch.device("cpu"), "gloo"),
        WorkerMetrics("t", 0, "cpu"),
        SpeedSimulator(None),
        None,
        StopRequests(),
        (RankFacts("cpu", True),),
    )


@dataclass
class Script:
    """A fresh script's objects: model, SGD with momentum, StepLR, a GradScaler and the loader."""

    model: HeteroModel
    optimizer: torch.optim.SGD
    scheduler: torch.optim.lr_scheduler.StepLR
    scaler: torch.amp.GradScaler
    loader: HeteroDataLoader
    checkpoint: Checkpoint


def fresh_script(tmp_path: Path) -> Script:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(200, 8), torch.randint(0, 3, (200,)))
    own = session(tmp_path)
    model = HeteroModel(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3)), session=own)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3)
    loader = HeteroDataLoader(data, batch_size=16, session=own)
    checkpoint = Checkpoint(
        model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler, loader=loader, session=own
    )
    return Script(model, optimizer, scheduler, scaler, loader, checkpoint)


def train(tmp_path: Path, stop_mid_epoch: bool) -> Script:
    run = fresh_script(tmp_path)
    run.checkpoint.restore()
    while run.loader.epoch < EPOCHS:
        for step, (x, y) in enumerate(run.loader):
            run.optimizer.zero_grad()
            run.scaler.scale(functional.cross_entropy(run.model(x), y)).backward()
            run.scaler.unscale_(run.optimizer)
            nn.utils.clip_grad_norm_(run.model.parameters(), max_norm=0.5)
            run.scaler.step(run.optimizer)
            run.scaler.update()
            if stop_mid_epoch and run.loader.epoch == 1 and step + 1 == STOP_AFTER_STEPS:
                run.checkpoint.save()
                return run
        run.scheduler.step()
    return run


def test_checkpoint_resumes_mid_epoch_to_the_uninterrupted_state(tmp_path: Path) -> None:
    straight = train(tmp_path / "straight", stop_mid_epoch=False)
    train(tmp_path / "stopped", stop_mid_epoch=True)
    saved = sorted(p.name for p in (tmp_path / "stopped" / "ckpt").iterdir())
    assert saved == [f"checkpoint-epoch-000001-sample-{STOP_AFTER_STEPS * 16:09d}.pt"]
    resumed = train(tmp_path / "stopped", stop_mid_epoch=False)
    # The expectation is the uninterrupted run; its scaler grew and its scheduler decayed, so a state
    # lost on restart would show.
    assert straight.scaler.get_scale() > 2.0**8
    assert resumed.scaler.get_scale() == straight.scaler.get_scale()
    assert resumed.scheduler.get_last_lr() == straight.scheduler.get_last_lr() == [0.2 * 0.5**EPOCHS]
    assert resumed.loader.position == straight.loader.position
    for name, tensor in straight.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name


def test_restore_gives_back_the_saved_scheduler_scaler_and_optimizer_state(tmp_path: Path) -> None:
    """What a fresh script restores is exactly what the stopped one held when it saved: momentum
    buffers, the scheduler's step count and rate, the GradScaler's grown scale and growth tracker."""
    stopped = train(tmp_path, stop_mid_epoch=True)
    saved = {
        "optimizer": copy.deepcopy(stopped.optimizer.state_dict()),
        "scheduler": stopped.scheduler.state_dict(),
        "scaler": stopped.scaler.state_dict(),
        "model": copy.deepcopy(stopped.model.state_dict()),
    }
    fresh = fresh_script(tmp_path)
    assert fresh.scaler.state_dict() != saved["scaler"]  # else the comparison below proves nothing
    assert fresh.checkpoint.restore()
    assert fresh.scheduler.state_dict() == saved["scheduler"]
    assert fresh.scaler.state_dict() == saved["scaler"]
    restored = fresh.optimizer.state_dict()
    assert restored["param_groups"] == saved["optimizer"]["param_groups"]
    for index, state in saved["optimizer"]["state"].items():
        assert torch.equal(restored["state"][index]["momentum_buffer"], state["momentum_buffer"])
    for name, tensor in saved["model"].items():
        assert torch.equal(fresh.model.state_dict()[name], tensor), name
    assert fresh.loader.position == stopped.loader.position


def test_the_averaging_schedule_resumes_at_the_step_the_checkpoint_was_saved(tmp_path: Path) -> None:
    """sesgd's groups and dreamddp's phases follow a step count: a restarted script must go on from
    the saved step, not from 0, or the ranks would average on another schedule than planned."""
    sesgd = Plan(
        version=1,
        strategy=Strategy.SESGD,
        world_size=1,
        global_batch=16,
        local_batches=[16],
        sesgd=SESGDParams(groups=1, seed=0),
    )
    stopped = fresh_script(tmp_path)
    stopped.loader.session.restore_plan(sesgd)
    ran = 0
    for x, y in stopped.loader:
        stopped.optimizer.zero_grad()
        functional.cross_entropy(stopped.model(x), y).backward()
        stopped.optimizer.step()
        ran += 1
        if ran == 7:
            stopped.checkpoint.save()  # as a script saves: after the step's optimizer step
            break
    fresh = fresh_script(tmp_path)
    fresh.loader.session.restore_plan(sesgd)
    assert fresh.checkpoint.restore()
    next(iter(fresh.loader))  # the first batch after the restart
    averaging = fresh.loader.session.step_averaging()
    # Every step the stopped script took has been averaged once, the one it saved inside included.
    assert averaging is not None and averaging.steps == ran


def test_the_worker_wrapper_becomes_the_command_without_importing_torch(tmp_path: Path) -> None:
    """`heterotrain worker -- CMD` starts every pod of a script of the user's own: it only sets the
    environment and becomes CMD, which imports torch itself. Importing torch (or the other commands'
    libraries) first would cost each pod about two seconds of CPU for nothing."""
    marker = tmp_path / "ran"
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "hetero_operator", "worker", "--", "touch", str(marker)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert marker.exists()
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "hetero_runtime.worker" in imported  # the listing is the wrapper's own
    heavy = {"torch", "numpy", "scipy", "sklearn", "fastapi", "kubernetes", "kopf"} & imported
    assert not heavy, f"the worker wrapper imported {sorted(heavy)}"
