"""The process group of a test script started by tests/runtime/spawn.py: its rank, world, device."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def join(backend: str | None = None) -> tuple[int, int, torch.device]:
    """Join the group on loopback. BACKEND (gloo by default, or nccl) and DEVICE (cpu by default;
    `own` for cuda:RANK; `shared` for cuda:0 on every rank) come from the environment."""
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device(
        {"cpu": "cpu", "own": f"cuda:{rank}", "shared": "cuda:0"}[os.environ.get("DEVICE", "cpu")]
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend or os.environ.get("BACKEND", "gloo"),
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    return rank, world, device


def leave() -> None:
    """Leave together, then at once: a rank that tears its connections down while another still uses
    them makes gloo abort that process, and torch's C++ teardown at interpreter exit has aborted a
    rank now and then after its work was done ("terminate called without an active exception")."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
