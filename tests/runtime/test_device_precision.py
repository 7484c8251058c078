"""Which device and backend a worker takes, which precision it resolves to, and fp16 loss scaling that
keeps the weighted gradient exact and skips an overflowing step on every rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.spawn import run_ranks

from hetero_operator.plan import Precision, Strategy
from hetero_runtime.device import DeviceError, choose_backend, choose_device, to_device
from hetero_runtime.launcher import WorkerEnvError, parse_worker_env
from hetero_runtime.precision import MixedPrecision, PrecisionError, resolve_precision

pytestmark = pytest.mark.ranks


def test_each_worker_takes_its_own_gpu_or_the_cpu() -> None:
    assert choose_device("auto", 0, 0) == "cpu"
    assert choose_device("auto", 1, 2) == "cuda:1"  # LOCAL_RANK picks among the visible GPUs
    assert choose_device("auto", 0, 1) == "cuda:0"  # a pod sees only its own GPU
    assert choose_device("cpu", 0, 8) == "cpu"  # a CPU worker beside GPU workers
    assert choose_device("cuda:3", 0, 4) == "cuda:3"
    with pytest.raises(DeviceError, match=r"LOCAL_RANK=2.*1 device"):
        choose_device("auto", 2, 1)
    with pytest.raises(DeviceError, match="no CUDA device"):
        choose_device("cuda", 0, 0)


def test_nccl_on_gpus_and_gloo_elsewhere() -> None:
    assert choose_backend("auto", "cuda") == "nccl"
    assert choose_backend("auto", "cpu") == "gloo"
    assert choose_backend("gloo", "cuda") == "gloo"  # GPU and CPU workers in one job
    with pytest.raises(DeviceError, match="nccl needs a CUDA device"):
        choose_backend("nccl", "cpu")


def test_worker_env_reads_device_settings_and_names_bad_ones() -> None:
    env = parse_worker_env({"LOCAL_RANK": "1", "HETEROTRAIN_PRECISION": "BF16", "HETEROTRAIN_DEVICE": "cpu"})
    assert (env.local_rank, env.precision, env.device, env.backend) == (1, Precision.BF16, "cpu", "auto")
    with pytest.raises(WorkerEnvError, match="HETEROTRAIN_PRECISION='fp8'"):
        parse_worker_env({"HETEROTRAIN_PRECISION": "fp8"})
    with pytest.raises(WorkerEnvError, match="HETEROTRAIN_DIST_BACKEND='mpi'"):
        parse_worker_env({"HETEROTRAIN_DIST_BACKEND": "mpi"})


@pytest.mark.parametrize(
    ("requested", "device", "bf16", "strategy", "expected"),
    [
        (Precision.AUTO, "cuda", True, Strategy.DATA, Precision.BF16),  # A100, H100
        (Precision.AUTO, "cuda", False, Strategy.DATA, Precision.FP16),  # V100, T4
        (Precision.AUTO, "cuda", False, Strategy.ESYNC, Precision.FP32),  # no synchronised loss scaling
        (Precision.AUTO, "cpu", True, Strategy.DATA, Precision.FP32),
        (Precision.FP32, "cuda", True, Strategy.HETPIPE, Precision.FP32),
        (Precision.FP16, "cuda", True, Strategy.DATA, Precision.FP16),
    ],
)
def test_auto_precision_follows_the_device(
    requested: Precision, device: str, bf16: bool, strategy: Strategy, expected: Precision
) -> None:
    assert resolve_precision(requested, device, bf16, strategy) is expected


def test_impossible_precisions_are_refused_naming_the_setting() -> None:
    with pytest.raises(PrecisionError, match=r"bf16.*no bf16"):
        resolve_precision(Precision.BF16, "cuda", False, Strategy.DATA)
    with pytest.raises(PrecisionError, match=r"fp16.*sesgd"):
        resolve_precision(Precision.FP16, "cuda", True, Strategy.SESGD)


def test_bf16_autocast_runs_the_forward_in_bf16_and_keeps_fp32_weights() -> None:
    amp = MixedPrecision(Precision.BF16, torch.device("cpu"))
    layer = torch.nn.Linear(4, 3)
    with amp.autocast():
        out = layer(torch.randn(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    assert amp.scaler is None and amp.loss_scale == 1.0


def test_batches_move_to_the_device_whole() -> None:
    batch = (torch.ones(2), {"mask": torch.zeros(3)}, [torch.ones(1)], "label")
    moved = to_device(batch, torch.device("cpu"), pin=False)
    assert moved[0] is batch[0] and moved[3] == "label"  # nothing to copy on the same device
    assert isinstance(moved, tuple) and isinstance(moved[2], list)


@pytest.fixture(scope="module")
def fp16(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks("mixed_precision.py", 3, tmp_path_factory.mktemp("fp16"))


@pytest.mark.timeout(120)
def test_fp16_loss_scaling_keeps_the_weighted_gradient_exact(fp16: list[dict[str, Any]]) -> None:
    for result in fp16:
        assert result["scale"] > 1 and result["first_taken"]
        # Against the same slices' scaled fp16 gradients summed in float64: only summation order.
        assert result["synced_vs_brute"] < 1e-6
        assert result["update_vs_brute"] < 1e-4  # the optimizer stepped on the unscaled gradient
        assert result["synced_vs_fp32"] < 5e-3  # and it is the fp32 full-batch gradient to fp16 accuracy


@pytest.mark.timeout(120)
def test_an_overflow_on_one_rank_skips_the_step_on_every_rank(fp16: list[dict[str, Any]]) -> None:
    for result in fp16:
        assert result["overflow_taken"] is False and result["unchanged_by_overflow"]
        assert result["scale_after_overflow"] == result["scale_before_overflow"] / 2
        assert result["third_taken"] and result["skipped_steps"] == 1
        assert result["replicas_identical"]


def test_checkpoints_refuse_anything_but_tensors(tmp_path: Path) -> None:
    import pickle

    from hetero_runtime.checkpoint import load

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("code ran while loading",))

    path = tmp_path / "checkpoint-epoch-000001.pt"
    torch.save({"epochs_done": 1, "model": {"w": torch.ones(2)}}, path)
    assert load(path)["epochs_done"] == 1
    with path.open("wb") as handle:
        pickle.dump({"epochs_done": Payload()}, handle, protocol=2)
    with pytest.raises(pickle.UnpicklingError):
        load(path)
