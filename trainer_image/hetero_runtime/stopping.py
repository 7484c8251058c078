"""Checkpoint first: a worker asked to stop (SIGTERM, or the operator's checkpoint annotation on its
pod) finishes the step it is in, saves a checkpoint with the sampler's position, and exits.

Every rank must stop after the same step, or the last collective of one would wait forever for the
others. The request reaches the ranks at different moments, so they vote: a strategy whose steps end
in a collective carries the vote in it (data, esync); the others cast it beside the step without
waiting (`LaggedVote`: the verdict of step t's votes is read at step t+1, the same on every rank).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_operator.plan import CHECKPOINT_REQUESTED_ANNOTATION

log = logging.getLogger(__name__)

STOPPED_EXIT_CODE = 143
"""Exit status of a worker that stopped on request after saving its checkpoint (128 + SIGTERM, as a
process ended by SIGTERM reports). Not 0: a pod that ends 0 reads as a finished job."""
ANNOTATION_POLL_SECONDS = 0.5


def parse_annotations(text: str) -> dict[str, str]:
    """The Downward API's annotations file: one `key="value"` per line, the value quoted as a Go
    string literal (JSON reads those, escapes included)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep or not key:
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw.strip('"')
        found[key.strip()] = str(value)
    return found


class StopRequests:
    """Whether this worker has been asked to stop, and why."""

    def __init__(self, annotations_file: Path | None = None) -> None:
        self.annotations_file = annotations_file
        self._signalled = threading.Event()
        self._annotated = False
        self._checked = 0.0
        self._mtime: float | None = None

    def install_signal_handler(self) -> None:
        """SIGTERM no longer kills the process at once: it asks for a stop at the next step boundary
        (Kubernetes sends it on pod deletion, then waits the pod's grace period)."""
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        del signum, frame
        self._signalled.set()

    def request(self) -> None:
        """Ask for a stop from inside the process (tests, an embedding program)."""
        self._signalled.set()

    @property
    def reason(self) -> str | None:
        if self._signalled.is_set():
            return "SIGTERM"
        if self._annotated:
            return f"the operator's {CHECKPOINT_REQUESTED_ANNOTATION} annotation"
        return None

    def requested(self) -> bool:
        if self._signalled.is_set() or self._annotated:
            return True
        now = time.monotonic()
        if self.annotations_file is not None and now - self._checked >= ANNOTATION_POLL_SECONDS:
            self._checked = now
            self._annotated = self._annotation_present()
        return self._annotated

    def _annotation_present(self) -> bool:
        assert self.annotations_file is not None
        try:
            mtime = self.annotations_file.stat().st_mtime
            if mtime == self._mtime:
                return False
            self._mtime = mtime
            return CHECKPOINT_REQUESTED_ANNOTATION in parse_annotations(self.annotations_file.read_text())
        except OSError:
            return False


def agree(local: bool, world_size: int, device: torch.device) -> bool:
    """A blocking vote: True on every rank if any rank asks (for epoch boundaries)."""
    if world_size == 1:
        return local
    flag = torch.tensor([1.0 if local else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item() > 0)


class LaggedVote:
    """One vote per step without waiting for the others: each call casts this step's vote and returns
    the verdict of the previous step's (identical on every rank, as every rank casts the same number
    of votes). A rank blocks only if another has not yet finished the previous step."""

    def __init__(self, world_size: int, device: torch.device) -> None:
        self.world_size = world_size
        self.device = device
        self._pending: tuple[Any, torch.Tensor] | None = None

    def cast(self, local: bool) -> bool:
        if self.world_size == 1:
            return local
        verdict = self.settle()
        flag = torch.tensor([1.0 if local else 0.0], device=self.device)
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True), flag)
        return verdict

    def settle(self) -> bool:
        """Collect the outstanding vote (every rank calls this at the same point, e.g. an epoch end)."""
        if self._pending is None:
            return False
        work, flag = self._pending
        self._pending = None
        work.wait()
        return bool(flag.item() > 0)
