"""Launcher env, metrics exporter, atomic checkpoints, ESync's decision, GNS."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import torch

from hetero_operator import metric_names as names
from hetero_runtime.checkpoint import checkpoint_path, latest_checkpoint, load, save_atomic
from hetero_runtime.esync_service import DeviceRecord, StateService, decide_ready
from hetero_runtime.gns import estimate_noise
from hetero_runtime.launcher import WorkerEnvError, parse_worker_env
from hetero_runtime.local import free_port, parse_speeds, sesgd_groups
from hetero_runtime.metrics import StepRecord, WorkerMetrics


def test_worker_env_parsing_and_errors() -> None:
    env = parse_worker_env(
        {
            "RANK": "2",
            "WORLD_SIZE": "3",
            "MASTER_ADDR": "10.0.0.1",
            "MASTER_PORT": "29400",
            "HETEROTRAIN_PLAN_SOURCE": "configmap://ns/p",
            "HETEROTRAIN_SIMULATED_SPEED": "0.25",
            "HETEROTRAIN_METRICS_PORT": "9400",
            "HETEROTRAIN_GPU_CLASS": "t4",
        }
    )
    assert (env.rank, env.world_size, env.init_method) == (2, 3, "tcp://10.0.0.1:29400")
    assert env.simulated_speed == 0.25 and env.metrics_port == 9400 and env.gpu_class == "t4"
    with pytest.raises(WorkerEnvError, match="MASTER_PORT is not set"):
        parse_worker_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(WorkerEnvError, match="RANK=3 must be < WORLD_SIZE=3"):
        parse_worker_env({"RANK": "3", "WORLD_SIZE": "3", "MASTER_PORT": "1"})
    with pytest.raises(WorkerEnvError, match=r"must be in \(0, 1\]"):
        parse_worker_env({"HETEROTRAIN_SIMULATED_SPEED": "4"})


def test_metrics_are_served_with_shared_names_and_labels() -> None:
    metrics = WorkerMetrics("job-a", 1, "v100")
    metrics.set_plan_version(3)
    metrics.record_step(StepRecord(0.02, 0.021, 0.005, 0.03, 18))
    metrics.record_step(StepRecord(0.04, 0.041, 0.001, 0.05, 18))
    metrics.set_plan_version(7)
    metrics.record_step(StepRecord(0.5, 0.5, 0.1, 0.7, 20))
    metrics.set_loss(0.5)
    port = free_port()
    metrics.serve(port, addr="127.0.0.1")
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    labels = f'{names.LABEL_GPU_CLASS}="v100",{names.LABEL_JOB}="job-a",{names.LABEL_RANK}="1"'
    # Step series are kept apart per plan version, so one split's steps can be averaged alone.
    v3 = (
        f'{names.LABEL_GPU_CLASS}="v100",{names.LABEL_JOB}="job-a",'
        f'{names.LABEL_PLAN_VERSION}="3",{names.LABEL_RANK}="1"'
    )
    v7 = v3.replace('"3"', '"7"')
    assert f"{names.histogram_sum(names.STEP_COMPUTE_SECONDS)}{{{v3}}} 0.06" in text
    assert f"{names.histogram_count(names.STEP_COMM_SECONDS)}{{{v3}}} 2.0" in text
    assert f"{names.histogram_count(names.STEP_COMM_SECONDS)}{{{v7}}} 1.0" in text
    assert f"{names.total(names.SAMPLES)}{{{v3}}} 36.0" in text
    assert f"{names.PLAN_VERSION}{{{labels}}} 7.0" in text
    assert f"{names.LOCAL_BATCH}{{{labels}}} 20.0" in text


def test_checkpoints_are_atomic_and_latest_wins(tmp_path: Path) -> None:
    save_atomic({"epochs_done": 1, "w": torch.ones(3)}, checkpoint_path(tmp_path, 1))
    save_atomic({"epochs_done": 12}, checkpoint_path(tmp_path, 12))
    (tmp_path / ".checkpoint-epoch-000099.pt.abc.tmp").write_bytes(b"partial")  # a crash mid-write
    latest = latest_checkpoint(tmp_path)
    assert latest == checkpoint_path(tmp_path, 12) and load(latest)["epochs_done"] == 12
    assert latest_checkpoint(tmp_path / "absent") is None

    class Unpicklable:
        def __reduce__(self) -> tuple:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        save_atomic({"bad": Unpicklable()}, checkpoint_path(tmp_path, 13))
    assert latest_checkpoint(tmp_path) == checkpoint_path(tmp_path, 12)
    assert not list(tmp_path.glob(".checkpoint-epoch-000013*"))


def test_esync_decision_rule() -> None:
    records = {0: DeviceRecord(0.1, 0.0), 1: DeviceRecord(0.25, 0.0), 2: DeviceRecord(0.5, 0.0)}
    assert not decide_ready(records, 0, 0, 0.001, 0.0)  # never before one step
    assert decide_ready(records, 2, 1, 0.001, 0.5)  # the slowest stops after one step
    assert not decide_ready(records, 0, 1, 0.001, 0.1)  # 0.4 s left of the slowest's step: go on
    assert decide_ready(records, 0, 4, 0.001, 0.4)  # 0.1 s left: one more step would not fit
    records[2].ready = True
    assert decide_ready(records, 1, 1, 0.001, 0.1)  # the slowest already stopped
    records[2].round = 0
    records[0].round = 1
    assert not decide_ready(records, 0, 1, 0.001, 0.4)  # the slowest has not pulled the new model


def test_esync_service_counts_match_the_closed_form() -> None:
    """Drive the service with the note's step times; the steps per device follow the speed order."""
    service = StateService(3, 0.001)
    times = [0.01, 0.025, 0.05]
    for rank, c in enumerate(times):
        service.query(rank, 0, c)
    start = time.monotonic()
    steps = [0, 0, 0]
    finished = [False] * 3
    next_done = [start + c for c in times]
    while not all(finished):
        rank = min((r for r in range(3) if not finished[r]), key=lambda r: next_done[r])
        time.sleep(max(0.0, next_done[rank] - time.monotonic()))
        steps[rank] += 1
        if service.query(rank, steps[rank], times[rank]):
            finished[rank] = True
        else:
            next_done[rank] += times[rank]
    assert steps[2] == 1 and steps[0] > steps[1] >= 1


def test_noise_scale_needs_two_training_ranks() -> None:
    assert estimate_noise([10, 0], [1.0, 0.0], 1.0) is None
    estimate = estimate_noise([72, 36, 20], [1.9, 2.8, 4.2], 1.5)
    assert estimate is not None and estimate.noise_scale == pytest.approx(65.207547, rel=1e-6)


def test_local_helpers() -> None:
    assert parse_speeds("1,0.5,0.25", 3) == [1.0, 0.5, 0.25]
    with pytest.raises(ValueError, match="one per worker"):
        parse_speeds("1,0.5", 3)
    assert [sesgd_groups(n) for n in (1, 3, 4, 8, 16)] == [1, 1, 2, 2, 4]
