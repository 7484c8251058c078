"""Atomic checkpoints: write to a temporary file in the same directory, fsync, then rename."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^checkpoint-epoch-(\d{6})\.pt$")


def checkpoint_path(directory: Path, epoch: int) -> Path:
    """Name of the checkpoint taken after `epoch` epochs have completed."""
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
    """The checkpoint with the highest completed-epoch count, ignoring temporary files."""
    if directory is None or not directory.is_dir():
        return None
    found = sorted(
        (int(match.group(1)), entry)
        for entry in directory.iterdir()
        if (match := _NAME.match(entry.name)) is not None
    )
    return found[-1][1] if found else None


def load(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    return state
