"""Each rank backpropagates its uneven slice; the synchronised gradient must equal the full-batch one.

BACKEND (gloo, default, or nccl) and DEVICE (cpu, default; `own` for cuda:RANK; `shared` for cuda:0
on every rank) choose where it runs; the reference is always computed in float64 on the CPU."""

import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from rank_group import join, leave
from torch import nn
from torch.nn import functional

from hetero_runtime.sampler import rank_slices
from hetero_runtime.strategies.data import synchronize_gradients

rank, world, device = join()
backend = dist.get_backend()
local_batches = [int(x) for x in os.environ["LOCAL_BATCHES"].split(",")]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(sum(local_batches), 16, generator=generator)
targets = torch.randint(0, 5, (sum(local_batches),), generator=generator)

reference = copy.deepcopy(model)
functional.cross_entropy(reference(inputs), targets).backward()
expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

own = rank_slices(local_batches, 0)[rank]
model = model.to(device)
params = list(model.parameters())
loss = 0.0
if local_batches[rank] > 0:
    batch_loss = functional.cross_entropy(model(inputs[own].to(device)), targets[own].to(device))
    batch_loss.backward()
    loss = float(batch_loss)
result = synchronize_gradients(params, local_batches[rank], sum(local_batches), loss, rank, world)
assert all(p.grad.device == device for p in params), "the synchronised gradients stay on the device"
synced = torch.cat([p.grad.reshape(-1) for p in params]).cpu()

# What plain averaging of the local mean gradients would give, to show the weighting matters.
plain = torch.zeros_like(synced)
for p in reference.parameters():
    p.grad = None
slices = rank_slices(local_batches, 0)
for r, s in enumerate(slices):
    if local_batches[r] == 0:
        continue
    functional.cross_entropy(reference(inputs[s]), targets[s]).backward()
    plain += torch.cat([p.grad.reshape(-1) for p in reference.parameters()]) / world
    for p in reference.parameters():
        p.grad = None

full_loss = float(functional.cross_entropy(reference(inputs), targets))
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(
    json.dumps(
        {
            "max_abs_diff": float((synced - expected).abs().max()),
            "plain_average_diff": float((plain - expected).abs().max()),
            "loss": result.loss,
            "full_loss": full_loss,
            "local_sq_norms": result.local_sq_norms,
            "device": str(device),
        }
    )
)
if device.type == "cuda" and backend != "nccl":
    leave()  # gloo sends no CUDA tensor point to point: the pipeline below needs NCCL

# --- hetpipe with Nm = 1: the same 3 ranks as one pipeline (stages cut at layers 1 and 2) --------
from hetero_operator.plan import HetPipeParams  # noqa: E402
from hetero_runtime.simulate import SpeedSimulator  # noqa: E402
from hetero_runtime.strategies.hetpipe import PipelineStage  # noqa: E402
from hetero_runtime.strategies.hetpipe_layout import place_of  # noqa: E402

# The same group goes on: leaving it and joining again on the same port let a fast rank reach rank
# 0's old store before rank 0 had closed it, and the new rendezvous then waited for it in vain.
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))
reference = copy.deepcopy(model)
model = model.to(device)
reference_loss = functional.cross_entropy(reference(inputs), targets)
reference_loss.backward()
params = HetPipeParams(virtual_workers=[[0, 1, 2]], stage_boundaries=[[1, 2]], microbatches_in_flight=1)
stage = PipelineStage(
    model, place_of(params, rank, len(model)), functional.cross_entropy, SpeedSimulator(None)
)
loss_total, _ = stage.run_wave([(inputs.to(device), targets.to(device))])
diffs = [
    float((mine.grad.cpu() - theirs.grad).abs().max())
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True)
    if mine.grad is not None
]
own_layers = [i for i, layer in enumerate(model) if any(p.grad is not None for p in layer.parameters())]
result = json.loads(Path(os.environ["OUT_DIR"], f"rank-{rank}.json").read_text())
result |= {
    "pipeline_grad_max_abs_diff": max(diffs) if diffs else 0.0,
    "pipeline_layers_with_grads": own_layers,
    "pipeline_loss": loss_total,
    "reference_loss": float(reference_loss),
}
Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(json.dumps(result))
leave()
