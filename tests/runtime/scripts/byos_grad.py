"""A wrapped model and loader over 71 samples, global batch 70, split 40/21/9 by the plan: each epoch's
step 1 is uneven, step 2 has one sample, which falls to rank 0 (ranks 1 and 2 compute on a stand-in
whose gradient must count zero). Epoch 0 sets the gradients to None every step; epoch 1 accumulates
both steps; epoch 2 zeroes them in place every step (they are views of the buckets then). Then
`no_sync()`: epoch 3 accumulates its uneven first step locally and synchronises at its one-sample
second; epochs 4 and 5 are one accumulation, whose second step alone stays local (after a
synchronised one). The references are computed in float64 on one process from the data alone: the
whole set's gradient g and the last sample's g₂ give step 1's, g₁ = (71·g − g₂)/70."""

import contextlib
import copy
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

import hetero_runtime.wrap as heterotrain

torch.set_num_threads(1)
session = heterotrain.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 5))
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(71, 16, generator=generator)
targets = torch.randint(0, 5, (71,), generator=generator)
reference = copy.deepcopy(net).double()


def reference_gradient(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    reference.zero_grad()
    functional.cross_entropy(reference(x.double()), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in reference.parameters()])


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()


whole = reference_gradient(inputs, targets)
# Two buckets (the last three parameters, then the first), each measuring the noise every step.
model = heterotrain.HeteroModel(net, noise_every=1, bucket_cap_elements=200)
assert model.reduce.layout == [[3, 2, 1], [0]], model.reduce.layout
loader = heterotrain.HeteroDataLoader(TensorDataset(inputs, targets), batch_size=70)
measured = []  # the squared norms each step's buckets carried
finish = model.reduce.finish


def keep_norms() -> object:
    reduced = finish()
    measured.append(reduced.norms)
    return reduced


model.reduce.finish = keep_norms  # type: ignore[method-assign]
report = {"planned_batch": loader.local_batch, "gradient_scale": float(whole.abs().max())}
# (epoch, accumulate, set to None when zeroing (None: the epoch goes on accumulating), local steps)
MODES = ((0, False, True, ()), (1, True, True, ()), (2, False, False, ()))
MODES += ((3, True, True, (0,)), (4, True, False, (1,)), (5, True, None, ()))
for epoch, accumulate, set_to_none, local_steps in MODES:
    lengths, grads, last = [], [], None
    if set_to_none is not None:
        model.zero_grad(set_to_none=set_to_none)
    for x, y in loader:
        if not accumulate:
            model.zero_grad(set_to_none=bool(set_to_none))
        if epoch == 0 and not lengths:
            own = float(reference_gradient(x, y).square().sum())
            every_rank: list[float] = [0.0] * dist.get_world_size()
            dist.all_gather_object(every_rank, own)
        with model.no_sync() if len(lengths) in local_steps else contextlib.nullcontext():
            functional.cross_entropy(model(x), y).backward()
        lengths.append(len(x))
        grads.append(flat(model))
        last = (x, y)
    holder = [last]
    dist.broadcast_object_list(holder, src=0)  # rank 0 trained on the last sample
    last_step = reference_gradient(*holder[0])
    first_step = (71 * whole - last_step) / 70
    if epoch == 0:
        # The first step's norms: each rank's |g_i|² of its own batch's mean loss, and |g|² of the step's.
        norms = measured[0]
        scale = max(every_rank)
        report["local_sq_diff"] = (
            max(abs(a - b) for a, b in zip(norms.local_sq, every_rank, strict=True)) / scale
        )
        report["global_sq_diff"] = abs(norms.global_sq - float(first_step.square().sum())) / scale
    if epoch == 4:
        diff = (grads[0] - first_step).abs().max()  # step 2 is local: no whole-batch gradient yet
        before = first_step + last_step  # (each epoch's order differs: its own last sample)
    elif epoch == 5:  # the accumulation epoch 4 began
        diff = torch.maximum(
            (grads[0] - (before + first_step)).abs().max(),
            (grads[1] - (before + first_step + last_step)).abs().max(),
        )
    elif accumulate:
        diff = (grads[1] - (first_step + last_step)).abs().max()
    else:
        diff = torch.maximum((grads[0] - first_step).abs().max(), (grads[1] - last_step).abs().max())
    report[f"epoch_{epoch}"] = {"batch_lengths": lengths, "max_abs_diff": float(diff)}
report["synchronized_steps"] = model.synchronized_steps
report["noise_measured"] = session.noise.estimate is not None
Path(os.environ["OUT_DIR"], f"rank-{session.rank}.json").write_text(json.dumps(report))
heterotrain.leave()
