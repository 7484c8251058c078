"""Checkpoint: save and restore the script's own objects (model, optimizer, LR scheduler, GradScaler,
loader position, anything with state_dict/load_state_dict) in the runtime's checkpoint directory.

Rank 0 writes, atomically, under the runtime's naming (epochs done, samples into the next epoch);
on a restart rank 0 reads the newest checkpoint and every rank receives it, so the ranks need not
share a file system for reading.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

from hetero_runtime import checkpoint as files
from hetero_runtime.wrap.session import Session, WrapperError, current_session

log = logging.getLogger(__name__)


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> Any: ...


class Checkpoint:
    """`Checkpoint(model=..., optimizer=..., scheduler=..., scaler=..., loader=...)`; `restore()` once
    before the loop, `save()` whenever the script wants a restart point (every epoch, say)."""

    def __init__(
        self, directory: str | Path | None = None, *, session: Session | None = None, **objects: Any
    ) -> None:
        if not objects:
            raise WrapperError("Checkpoint(...): name the objects to save, e.g. model=model, optimizer=opt")
        for name, value in objects.items():
            if not (
                callable(getattr(value, "state_dict", None))
                and callable(getattr(value, "load_state_dict", None))
            ):
                raise WrapperError(
                    f"Checkpoint({name}=...): a {type(value).__name__} has no state_dict() and "
                    "load_state_dict(): pass objects that do (model, optimizer, LR scheduler, GradScaler, "
                    "HeteroDataLoader)"
                )
        self.session = session or current_session()
        self.directory = Path(directory) if directory is not None else self.session.env.checkpoint_dir
        self.objects: dict[str, Stateful] = objects

    def _position(self) -> tuple[int, int]:
        """(epochs done, samples into the next epoch), from the loader's position when one is saved."""
        for value in self.objects.values():
            position = getattr(value, "position", None)
            if position is not None and hasattr(position, "consumed"):
                return int(position.epoch), int(position.consumed)
        return 0, 0

    def save(self) -> Path | None:
        """Write every object's state (rank 0 only); the path written, or None without a directory."""
        if self.directory is None or self.session.rank != 0:
            return None
        epoch, consumed = self._position()
        state = {name: value.state_dict() for name, value in self.objects.items()}
        path = files.checkpoint_path(self.directory, epoch, consumed)
        files.save_atomic(state, path)
        return path

    def restore(self) -> bool:
        """Load the newest checkpoint into the objects, on every rank; False when there is none."""
        path, state = files.restore_newest(self.directory, self.session.rank, self.session.world_size)
        if path is not None:
            log.info("resuming from %s", path)
        if state is None:
            return False
        missing = sorted(set(self.objects) - set(state))
        if missing:
            raise WrapperError(
                f"checkpoint lacks {', '.join(missing)} (it holds {', '.join(sorted(state))}): save and "
                "restore the same objects, or start from an empty checkpoint directory"
            )
        for name, value in self.objects.items():
            value.load_state_dict(state[name])
        return True
