"""The user API: hand over model, optimizer, dataset and loss; the runtime does the rest.

    job = TrainingJob(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                      dataset=train_set, loss_fn=torch.nn.functional.cross_entropy,
                      evaluate=lambda m: {"accuracy": accuracy(m, test_set)}, epochs=5)
    job.fit()

Rank, world size, rendezvous, plan location, metrics port, checkpoints and simulated speed come from
the environment that the operator's pods (or `heterotrain run-local`) set. The runtime moves the model
to the worker's device (its GPU when it has one) before training: `evaluate` receives it there and
must bring its own data to `next(model.parameters()).device`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from hetero_operator.plan import Strategy
from hetero_runtime.launcher import WorkerEnv, worker_env_from_os
from hetero_runtime.strategies.base import EvaluateFn, LossFn
from hetero_runtime.trainer import Trainer, TrainingResult, WorkerStopped


@dataclass
class TrainingJob:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    dataset: Dataset[Any]
    loss_fn: LossFn
    epochs: int = 1
    global_batch: int = 64
    strategy: Strategy = Strategy.DATA
    evaluate: EvaluateFn | None = None
    options: dict[str, Any] = field(default_factory=dict)
    """Strategy options that are properties of the model rather than of the plan (e.g. hetpipe's
    `layers`, the nn.Sequential to cut into stages)."""

    def fit(self, env: WorkerEnv | None = None) -> TrainingResult:
        """Train under the plan in effect; returns what this rank measured.

        Asked to stop (SIGTERM, or the operator's checkpoint annotation), it saves a checkpoint at the
        next step boundary and raises WorkerStopped, a SystemExit: the process ends with status 143."""
        # One intra-op thread unless the environment asks for more: several workers share a host here.
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or 1))
        trainer = Trainer(
            env=env or worker_env_from_os(),
            ctx_parts={
                "model": self.model,
                "optimizer": self.optimizer,
                "dataset": self.dataset,
                "loss_fn": self.loss_fn,
            },
            epochs=self.epochs,
            global_batch=self.global_batch,
            strategy=self.strategy,
            evaluate=self.evaluate,
            strategy_options=self.options,
        )
        result = trainer.run()
        if result.stopped is not None:
            raise WorkerStopped(result.stopped)
        return result
