"""A wrapped model fed from an IterableDataset of 71 numbered samples, global batch 20: epoch 0 under
the plan 10/6/4, then rank 0 (acting as the operator) writes a plan of 4/6/10 that applies at epoch 1.
Each rank reports which samples it got per step; after every step its .grad must equal the gradient of
that step's whole global batch, computed in float64 on one process from the stream itself."""

import copy
import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional
from torch.utils.data import IterableDataset

import hetero_runtime.wrap as heterotrain
from hetero_operator.plan import Plan

SAMPLES = 71
generator = torch.Generator().manual_seed(1)
inputs = torch.randn(SAMPLES, 8, generator=generator)
targets = torch.randint(0, 3, (SAMPLES,), generator=generator)


class Numbered(IterableDataset[tuple[torch.Tensor, torch.Tensor, int]]):
    """The same samples in the same order on every rank, each with its number."""

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor, int]]:
        return ((inputs[i], targets[i], i) for i in range(SAMPLES))


torch.set_num_threads(1)
session = heterotrain.init()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
reference = copy.deepcopy(net).double()
model = heterotrain.HeteroModel(net)
loader = heterotrain.HeteroDataLoader(Numbered(), batch_size=20)
report: dict[str, object] = {"epochs": []}
for epoch in range(2):
    steps, worst = [], 0.0
    start = 0
    for x, y, numbers in loader:
        model.zero_grad()
        functional.cross_entropy(model(x), y).backward()
        sizes = session.step.sizes if session.step is not None else []
        own = numbers.tolist() if session.step is not None and session.step.local_batch > 0 else []
        steps.append({"sizes": sizes, "own": own})
        whole = slice(start, start + sum(sizes))
        start += sum(sizes)
        reference.zero_grad()
        functional.cross_entropy(reference(inputs[whole].double()), targets[whole]).backward()
        expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        got = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()
        worst = max(worst, float((got - expected).abs().max() / expected.abs().max()))
    report["epochs"].append({"steps": steps, "relative_grad_error": worst})  # type: ignore[attr-defined]
    if epoch == 0 and session.rank == 0:
        plan = Plan.from_json(Path(os.environ["HETEROTRAIN_PLAN_SOURCE"]).read_text())
        later = plan.model_copy(update={"version": 2, "apply_at_epoch": 1, "local_batches": [4, 6, 10]})
        Path(os.environ["HETEROTRAIN_PLAN_SOURCE"]).write_text(later.to_json())
Path(os.environ["OUT_DIR"], f"rank-{session.rank}.json").write_text(json.dumps(report))
heterotrain.leave()
