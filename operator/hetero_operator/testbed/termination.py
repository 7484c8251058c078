"""A pod's termination message, as a kubelet keeps it: a file mounted at the container's
terminationMessagePath, whose last 4 KiB become the terminated state's message."""

from __future__ import annotations

from pathlib import Path

MAX_TERMINATION_MESSAGE = 4096  # bytes, as a kubelet reads them


def new_termination_log(pod_dir: Path) -> Path:
    """An empty file for the container's termination message, writable by any user (as a kubelet
    makes it: the container may run as another user)."""
    path = pod_dir / "termination-log"
    path.write_text("")
    path.chmod(0o666)
    return path


def termination_message(path: Path | None) -> str | None:
    """What the container wrote as its termination message (its last 4 KiB), or None."""
    if path is None:
        return None
    try:
        data = path.read_bytes()[-MAX_TERMINATION_MESSAGE:]
    except OSError:
        return None
    return data.decode(errors="replace").strip() or None
