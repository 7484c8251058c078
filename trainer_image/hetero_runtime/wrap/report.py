"""What a wrapped script's workers report per epoch: the progress line rank 0 prints for its
supervisor, and the result file every rank keeps (the same shape of record the runtime's loop writes)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hetero_runtime.progress import emit_progress


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    plan_version: int
    local_batch: int  # this rank's planned batch
    samples: int  # samples this rank trained on (stand-ins not counted)
    steps: int
    wall_seconds: float
    extra: dict[str, float] = field(default_factory=dict)
    strategy: str = "data"  # the plan's: how this epoch's steps were synchronised
    global_samples: int = 0  # samples every rank trained on together (a short last step as it was)


@dataclass
class RunRecord:
    rank: int
    world_size: int
    epochs: list[EpochRecord] = field(default_factory=list)
    plan_history: list[tuple[int, int]] = field(default_factory=list)  # (epoch, version) at every change

    def plan_applied(self, epoch: int, version: int) -> None:
        if not self.plan_history or self.plan_history[-1][1] != version:
            self.plan_history.append((epoch, version))

    def epoch_done(self, record: EpochRecord, total_epochs: int | None, result_file: Path | None) -> None:
        self.epochs.append(record)
        if self.rank == 0:
            # `loss` is the script's own business: the wrapper never sees it.
            emit_progress(
                {
                    **asdict(record),
                    "epoch": record.epoch + 1,
                    "epochs": total_epochs,  # None: the script did not say how many
                    "loss": None,
                    "evaluation": {},
                }
            )
        if result_file is not None:
            result_file.parent.mkdir(parents=True, exist_ok=True)
            result_file.write_text(json.dumps(asdict(self), indent=2))
