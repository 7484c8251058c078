"""A wrapped model and loader over 71 samples, global batch 70, split 40/21/9 by the plan: step 1 is
uneven, step 2 has one sample (ranks 1 and 2 compute on a stand-in whose gradient must count zero).
The reference is the whole dataset's gradient, in float64 on one process: 70·g₁ + 1·g₂ = 71·g."""

import copy
import json
import os
from pathlib import Path

import torch
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
functional.cross_entropy(reference(inputs.double()), targets).backward()
expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])

model = heterotrain.HeteroModel(net)
loader = heterotrain.HeteroDataLoader(TensorDataset(inputs, targets), batch_size=70)
steps = []
for x, y in loader:
    model.zero_grad()
    functional.cross_entropy(model(x), y).backward()
    steps.append((len(x), torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()))

combined = (70 * steps[0][1] + 1 * steps[1][1]) / 71
Path(os.environ["OUT_DIR"], f"rank-{session.rank}.json").write_text(
    json.dumps(
        {
            "batch_lengths": [length for length, _ in steps],
            "planned_batch": loader.local_batch,
            "max_abs_diff": float((combined - expected).abs().max()),
            "gradient_scale": float(expected.abs().max()),
            "synchronized_steps": model.synchronized_steps,
        }
    )
)
heterotrain.close()
