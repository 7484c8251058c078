"""heterotrain: the operator's own scheduler cycle (mixed classes, optimal batch split, HetPipe
virtual workers, priority preemption), under a `SchedulerConfig`.

``heterotrain`` runs without head reservations and without elastic growth: in simulation both cost
average job completion time (reservations leave GPUs idle while a large head waits; grown jobs keep
GPUs that later arrivals need). ``heterotrain-default`` runs the operator's default configuration.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_operator.scheduler import Decisions, SchedulerConfig, Snapshot, schedule

THROUGHPUT_FIRST = SchedulerConfig(elastic=False, head_reservations=False)


@dataclass(slots=True)
class HeterotrainPolicy:
    config: SchedulerConfig = field(default_factory=lambda: THROUGHPUT_FIRST)
    name: str = "heterotrain"
    pipelines: bool = True
    round_s: float | None = None

    def decide(self, snapshot: Snapshot) -> Decisions:
        return schedule(snapshot, self.config)


def operator_defaults() -> HeterotrainPolicy:
    """The scheduler exactly as the operator ships it (elastic growth, head reservations)."""
    return HeterotrainPolicy(SchedulerConfig(), name="heterotrain-default")
