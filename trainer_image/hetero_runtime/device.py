"""Where a worker computes and how it talks to its peers: its own GPU over NCCL when it has one, the CPU
over gloo otherwise. Every tensor a strategy creates goes on this device; batches come from pinned
host memory when the device is a GPU, so the copy overlaps the compute."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from hetero_runtime.launcher import BACKEND_ENV, DEVICE_ENV, WorkerEnv


class DeviceError(ValueError):
    """The worker's device or backend settings cannot be met on this host."""


def choose_device(requested: str, local_rank: int, cuda_devices: int) -> str:
    """'cpu' or 'cuda:N' for a worker; pure, so every case is testable without a GPU."""
    if requested == "cpu":
        return "cpu"
    if requested == "auto" and cuda_devices == 0:
        return "cpu"
    if cuda_devices == 0:
        raise DeviceError(f"{DEVICE_ENV}={requested}: no CUDA device is visible to this worker")
    index = local_rank if requested in ("auto", "cuda") else int(requested.split(":", 1)[1])
    if index >= cuda_devices:
        raise DeviceError(
            f"CUDA device {index} (LOCAL_RANK={local_rank}, {DEVICE_ENV}={requested}) is not visible: "
            f"{cuda_devices} device(s) are; give each worker its own GPU or run fewer workers per host"
        )
    return f"cuda:{index}"


def choose_backend(requested: str, device_type: str) -> str:
    """NCCL for GPU workers, gloo for CPU workers (or whenever asked: a job mixing GPU and CPU
    workers, or several ranks sharing one GPU, which NCCL refuses)."""
    if requested == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if requested == "nccl" and device_type != "cuda":
        raise DeviceError(f"{BACKEND_ENV}=nccl needs a CUDA device, but this worker runs on {device_type}")
    return requested


@dataclass(frozen=True)
class Placement:
    device: torch.device
    backend: str

    @property
    def pin_memory(self) -> bool:
        return self.device.type == "cuda"


class PlacedRank:
    """What a worker's rank, world and device come from, for the classes that hold both (the worker
    session, the strategies' context)."""

    env: WorkerEnv
    placement: Placement

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def device(self) -> torch.device:
        return self.placement.device


def place_worker(env: WorkerEnv) -> Placement:
    """The device and backend of this worker; makes the GPU current (NCCL and object collectives use it)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = torch.device(choose_device(env.device, env.local_rank, count))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return Placement(device, choose_backend(env.backend, device.type))


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`batch` with `fn` applied to every tensor in it, nested in tuples, lists or dicts."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        moved = [map_tensors(value, fn) for value in batch]
        return tuple(moved) if isinstance(batch, tuple) else moved
    return batch


def to_device(batch: Any, device: torch.device, pin: bool) -> Any:
    """A collated batch moved to `device`; from pinned memory, without blocking, when the device is a
    GPU (a batch the loader pinned already is not copied again)."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == device:
            return tensor
        if pin and tensor.device.type == "cpu":
            source = tensor if tensor.is_pinned() else tensor.pin_memory()
            return source.to(device, non_blocking=True)
        return tensor.to(device)

    return map_tensors(batch, move)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter (or buffer); CPU for a model with neither."""
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")
