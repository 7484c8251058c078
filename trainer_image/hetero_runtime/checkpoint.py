"""Atomic checkpoints: write to a temporary file in the same directory, fsync, then rename.

A checkpoint is named by the position it resumes from: epochs completed and, for one taken in the
middle of an epoch (a stop was requested), the samples of the next epoch already trained on. Loading
reads tensors and plain containers only (`weights_only=True`): a checkpoint cannot run code. Only rank
0 ever touches the directory: it writes, and on a resume it reads and sends the state to the others.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

_NAME = re.compile(r"^checkpoint-epoch-(\d{6})(?:-sample-(\d{9}))?\.pt$")


def checkpoint_path(directory: Path, epoch: int, consumed: int = 0) -> Path:
    """Name of the checkpoint taken after `epoch` epochs and `consumed` samples of the next one."""
    if consumed:
        return directory / f"checkpoint-epoch-{epoch:06d}-sample-{consumed:09d}.pt"
    return directory / f"checkpoint-epoch-{epoch:06d}.pt"


def save_atomic(state: dict[str, Any], path: Path) -> None:
    """Readers see either the old file or the complete new one, never a partial write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(state, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def latest_checkpoint(directory: Path | None) -> Path | None:
    """The checkpoint furthest into training, ignoring temporary files."""
    if directory is None or not directory.is_dir():
        return None
    found = sorted(
        ((int(match.group(1)), int(match.group(2) or 0)), entry)
        for entry in directory.iterdir()
        if (match := _NAME.match(entry.name)) is not None
    )
    return found[-1][1] if found else None


def load(path: Path) -> dict[str, Any]:
    """A checkpoint's state on the CPU; refuses anything but tensors and plain containers."""
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state


def restore_newest(
    directory: Path | None, rank: int, world_size: int
) -> tuple[Path | None, dict[str, Any] | None]:
    """(the file read, its state) on every rank: rank 0 reads the newest checkpoint and the others
    receive it over the process group, so they need no access to the directory (a ReadWriteOnce
    volume is mounted on rank 0's pod only). The path is None on the other ranks."""
    path = latest_checkpoint(directory) if rank == 0 else None
    state = load(path) if path is not None else None
    if world_size > 1:
        holder = [state]
        dist.broadcast_object_list(holder, src=0)
        state = holder[0]
    return path, state
