"""heterotrain: the operator's own scheduler cycle, unchanged (mixed classes, optimal batch split,
HetPipe virtual workers, elastic growth, priority preemption)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_operator.scheduler import Decisions, SchedulerConfig, Snapshot, schedule


@dataclass(slots=True)
class HeterotrainPolicy:
    config: SchedulerConfig = field(default_factory=SchedulerConfig)
    name: str = "heterotrain"
    pipelines: bool = True
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        return schedule(snapshot, self.config)
