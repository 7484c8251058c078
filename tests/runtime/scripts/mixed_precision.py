"""fp16 with loss scaling on 3 ranks (CPU autocast, gloo): the synchronised, unscaled gradient equals a
brute-force weighted sum of the same slices' scaled fp16 gradients; an overflow on one rank makes
every rank skip the step and halve its scale; the next step is taken everywhere.

BACKEND (gloo, default, or nccl) and DEVICE (cpu, default; `own` for cuda:RANK; `shared` for cuda:0
on every rank) choose where it runs; the brute-force reference runs on the same device."""

import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from rank_group import join, leave
from torch import nn
from torch.nn import functional

from hetero_operator.plan import Precision
from hetero_runtime.precision import MixedPrecision
from hetero_runtime.sampler import rank_slices
from hetero_runtime.strategies.data import synchronize_gradients

rank, world, device = join()
batches = [40, 21, 9]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5)).to(device)
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(sum(batches), 16, generator=generator).to(device)
targets = torch.randint(0, 5, (sum(batches),), generator=generator).to(device)
slices = rank_slices(batches, 0)
amp = MixedPrecision(Precision.FP16, device)
scale = amp.loss_scale
lr = 0.1
optimizer = torch.optim.SGD(model.parameters(), lr=lr)
params = list(model.parameters())


def flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def scaled_slice_gradient(net: nn.Module, part: slice) -> torch.Tensor:
    """One slice's gradient of S x loss under fp16 autocast, in float64."""
    net.zero_grad()
    with torch.autocast(device.type, dtype=torch.float16):
        loss = functional.cross_entropy(net(inputs[part]), targets[part])
    (loss.float() * scale).backward()
    return flat([p.grad for p in net.parameters()]).double().cpu()


reference = copy.deepcopy(model)
weighted = [
    (b / sum(batches)) * scaled_slice_gradient(reference, s) for b, s in zip(batches, slices, strict=True)
]
brute = sum(weighted) / scale
fp32_model = copy.deepcopy(model)
functional.cross_entropy(fp32_model(inputs), targets).backward()
fp32_full = flat([p.grad for p in fp32_model.parameters()]).double().cpu()
before = flat([p.detach().clone() for p in params]).double().cpu()

# Step 1: every rank's slice, scaled fp16, synchronised and unscaled by the step.
with amp.autocast():
    loss = functional.cross_entropy(model(inputs[slices[rank]]), targets[slices[rank]])
amp.backward(loss)
synchronize_gradients(params, batches[rank], sum(batches), float(loss), rank, world, loss_scale=scale)
synced = flat([p.grad for p in params]).double().cpu() / scale
taken = amp.step(optimizer)
after = flat([p.detach().clone() for p in params]).double().cpu()

# Step 2: rank 1's inputs overflow fp16; every rank must skip, every scale must halve.
optimizer.zero_grad()
scale_before = amp.loss_scale
poisoned = inputs[slices[rank]] * (1e6 if rank == 1 else 1.0)
with amp.autocast():
    loss = functional.cross_entropy(model(poisoned), targets[slices[rank]])
amp.backward(loss)
synchronize_gradients(params, batches[rank], sum(batches), 0.0, rank, world, loss_scale=scale_before)
skipped_taken = amp.step(optimizer)
scale_after_overflow = amp.loss_scale
after_skip = flat([p.detach().clone() for p in params]).double().cpu()

# Step 3: clean again, taken everywhere.
optimizer.zero_grad()
with amp.autocast():
    loss = functional.cross_entropy(model(inputs[slices[rank]]), targets[slices[rank]])
amp.backward(loss)
synchronize_gradients(
    params, batches[rank], sum(batches), float(loss), rank, world, loss_scale=amp.loss_scale
)
third_taken = amp.step(optimizer)
final = flat([p.detach().clone() for p in params]).double()
gathered = [torch.zeros_like(final) for _ in range(world)]
dist.all_gather(gathered, final)

Path(os.environ["OUT_DIR"], f"rank-{rank}.json").write_text(
    json.dumps(
        {
            "scale": scale,
            "synced_vs_brute": float((synced - brute).abs().max() / brute.abs().max()),
            "synced_vs_fp32": float((synced - fp32_full).abs().max() / fp32_full.abs().max()),
            "update_vs_brute": float(((before - after) / lr - brute).abs().max() / brute.abs().max()),
            "first_taken": taken,
            "overflow_taken": skipped_taken,
            "unchanged_by_overflow": bool(torch.equal(after, after_skip)),
            "scale_after_overflow": scale_after_overflow,
            "scale_before_overflow": scale_before,
            "third_taken": third_taken,
            "skipped_steps": amp.skipped_steps,
            "replicas_identical": all(torch.equal(final, other) for other in gathered),
        }
    )
)
leave()
