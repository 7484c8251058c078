"""Handwritten digits (scikit-learn's bundled 8x8 set) with a small MLP; reaches >= 90% test accuracy."""

from __future__ import annotations

import os

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn import functional
from torch.utils.data import TensorDataset

from hetero_runtime.api import TrainingJob

TARGET_ACCURACY = 0.90
# Knobs for demonstrations on a laptop: a wider model and several passes per epoch make each epoch
# last long enough to be measured from outside (Prometheus scrapes every few seconds).
HIDDEN_ENV = "DIGITS_HIDDEN"
PASSES_ENV = "DIGITS_PASSES_PER_EPOCH"


def load_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """80/20 stratified split, pixels scaled to [0, 1]."""
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data / 16.0, digits.target, test_size=0.2, random_state=seed, stratify=digits.target
    )

    def as_dataset(x: object, y: object) -> TensorDataset:
        return TensorDataset(torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.long))

    return as_dataset(x_train, y_train), as_dataset(x_test, y_test)


def build_model(hidden: int = 64) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10)
    )


def accuracy(model: nn.Module, data: TensorDataset) -> float:
    device = next(model.parameters()).device
    inputs, targets = (tensor.to(device) for tensor in data.tensors)
    return float((model(inputs).argmax(dim=1) == targets).float().mean())


def repeated(data: TensorDataset, passes: int) -> TensorDataset:
    """The training set `passes` times over, so that one epoch is that many passes."""
    if passes <= 1:
        return data
    return TensorDataset(*(tensor.repeat((passes,) + (1,) * (tensor.dim() - 1)) for tensor in data.tensors))


def build_job(epochs: int = 8, seed: int = 0) -> TrainingJob:
    torch.manual_seed(seed)
    train, test = load_split()
    train = repeated(train, int(os.environ.get(PASSES_ENV, "1")))
    model = build_model(int(os.environ.get(HIDDEN_ENV, "64")))
    return TrainingJob(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        dataset=train,
        loss_fn=functional.cross_entropy,
        epochs=epochs,
        global_batch=64,
        evaluate=lambda m: {"accuracy": accuracy(m, test)},
        options={"layers": model},
    )


def main() -> None:
    build_job().fit()


if __name__ == "__main__":
    main()
