"""The runtime on CUDA: uneven local gradients synchronised on the device equal the full-batch
gradient, over NCCL; fp16 loss scaling and bf16 autocast on the device.

How these tests use the GPUs (they are written to run on a one-GPU machine as well):
- NCCL refuses two ranks of a communicator on the same GPU ("Duplicate GPU detected",
  ncclInvalidUsage). Tests that need NCCL across ranks therefore give each rank its own GPU and are
  skipped with that reason when the machine has fewer GPUs than ranks.
- On a one-GPU machine the same multi-rank checks run with every rank on cuda:0 over gloo, which
  all-reduces and broadcasts CUDA tensors (staging them through host memory): the device-side code
  (gradients, weighting, loss scaling, overflow votes) is the same, only the transport differs.
- NCCL itself is exercised in a world of one process (process group bound to the GPU with
  `device_id`, object broadcast, all-reduce of a CUDA buffer), which needs one GPU.
The references are computed independently: float64 on the CPU for gradients, the same slices'
scaled fp16 gradients summed in float64 for loss scaling.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from tests.gpu.devices import gpus, need_gpus
from tests.runtime.scripts.precision_case import RANK_PRECISIONS, reference_parameters
from tests.runtime.spawn import run_ranks
from tests.runtime.test_mixed_precision_jobs import assert_one_exact_model, run_loop
from torch import nn

from hetero_operator.plan import Precision, Strategy
from hetero_runtime.local import free_port
from hetero_runtime.precision import MixedPrecision, device_has_bf16, resolve_precision
from hetero_runtime.strategies.data import synchronize_gradients

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def check_gradients(results: list[dict[str, Any]], device_prefix: str) -> None:
    for result in results:
        assert result["device"].startswith(device_prefix)
        assert result["max_abs_diff"] < 1e-5
        assert result["plain_average_diff"] > 1e-3  # the weighting does work on this split
        assert result["loss"] == pytest.approx(result["full_loss"], abs=1e-5)


@need_gpus(2)
def test_uneven_gradients_on_cuda_over_nccl_equal_the_full_batch(tmp_path: Path) -> None:
    world = min(3, gpus())
    batches = "40,21,9" if world == 3 else "40,9"
    results = run_ranks(
        "grad_equality.py",
        world,
        tmp_path,
        timeout=240,
        extra_env={"LOCAL_BATCHES": batches, "BACKEND": "nccl", "DEVICE": "own"},
    )
    check_gradients(results, "cuda:")
    if world == 3:  # the pipeline pass, activations and gradients sent GPU to GPU
        for result in results:
            assert result["pipeline_grad_max_abs_diff"] < 1e-5


def test_uneven_gradients_on_one_shared_gpu_equal_the_full_batch(tmp_path: Path) -> None:
    results = run_ranks(
        "grad_equality.py",
        3,
        tmp_path,
        timeout=240,
        extra_env={"LOCAL_BATCHES": "40,21,9", "BACKEND": "gloo", "DEVICE": "shared"},
    )
    check_gradients(results, "cuda:0")


def test_nccl_reduces_a_cuda_buffer_in_a_world_of_one() -> None:
    device = torch.device("cuda:0")
    torch.cuda.set_device(device)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        device_id=device,
    )
    try:
        model = nn.Linear(8, 3).to(device)
        model(torch.randn(5, 8, device=device)).square().mean().backward()
        before = [p.grad.clone() for p in model.parameters()]
        holder: list[Any] = [{"plan": 1}]
        dist.broadcast_object_list(holder, src=0)
        result = synchronize_gradients(list(model.parameters()), 5, 10, 0.5, 0, 1, stop=True)
        assert holder == [{"plan": 1}]
        for param, grad in zip(model.parameters(), before, strict=True):
            assert param.grad.device == device
            assert torch.allclose(param.grad, grad * 0.5)
        assert result.stop and result.loss == pytest.approx(0.25)
    finally:
        dist.destroy_process_group()


def check_fp16(results: list[dict[str, Any]]) -> None:
    for result in results:
        assert result["first_taken"] and result["synced_vs_brute"] < 1e-6
        assert result["synced_vs_fp32"] < 5e-3
        assert not result["overflow_taken"] and result["unchanged_by_overflow"]
        assert result["scale_after_overflow"] == result["scale_before_overflow"] / 2
        assert result["third_taken"] and result["replicas_identical"]


def test_fp16_loss_scaling_on_one_shared_gpu(tmp_path: Path) -> None:
    check_fp16(run_ranks("mixed_precision.py", 3, tmp_path, timeout=240, extra_env={"DEVICE": "shared"}))


@need_gpus(3)
def test_fp16_loss_scaling_over_nccl(tmp_path: Path) -> None:
    extra = {"DEVICE": "own", "BACKEND": "nccl"}
    check_fp16(run_ranks("mixed_precision.py", 3, tmp_path, timeout=240, extra_env=extra))


def test_auto_picks_bf16_where_the_gpu_has_it_and_autocasts_to_it() -> None:
    device = torch.device("cuda:0")
    has_bf16 = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and later
    assert device_has_bf16(device) is has_bf16
    chosen = resolve_precision(Precision.AUTO, "cuda", has_bf16, Strategy.DATA)
    assert chosen is (Precision.BF16 if has_bf16 else Precision.FP16)
    if chosen is Precision.FP16:
        return  # fp16 with loss scaling is checked by test_fp16_loss_scaling_on_one_shared_gpu
    amp = MixedPrecision(Precision.BF16, device)
    model = nn.Linear(16, 4).to(device)
    with amp.autocast():
        out = model(torch.randn(8, 16, device=device))
    assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.float32
    out.float().sum().backward()
    assert model.weight.grad is not None and model.weight.grad.dtype == torch.float32


@pytest.mark.parametrize("loop", ["runtime", "wrapper"])
def test_ranks_in_three_formats_on_one_gpu_train_one_exact_model(tmp_path: Path, loop: str) -> None:
    """The mixed-precision case of tests/runtime/test_mixed_precision_jobs.py on the device: three
    ranks on cuda:0 over gloo, computing in fp32, bf16 (a GPU with bf16, as the H100 and H200 are)
    and fp16 under the job-wide loss scale, against one process in float64 on the CPU."""
    if not device_has_bf16(torch.device("cuda:0")):
        pytest.skip("needs a GPU with bf16 (compute capability 8.0 or later) for the bf16 rank")
    device = {"HETEROTRAIN_DEVICE": "cuda:0", "HETEROTRAIN_DIST_BACKEND": "gloo"}
    results = run_loop(loop, tmp_path, "HETEROTRAIN_PRECISION", RANK_PRECISIONS, device)
    print(f"{loop} on {torch.cuda.get_device_name(0)}: parameters of rank 0 {results[0]['parameters'][:4]}")
    assert_one_exact_model(results, reference_parameters())
