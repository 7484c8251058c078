"""heterotrain: the operator's own scheduler cycle under the operator's default `SchedulerConfig`.

There is one configuration: what the operator runs by default is what the simulator reports. It
places each job on one class unless a mix of classes earns its keep, breaks near-ties toward cheaper
GPUs (so fast ones stay for jobs that gain most), backfills, runs models too big for a small class as
HetPipe virtual workers, grows jobs and moves them onto faster GPUs while those sit idle (and gives
grown GPUs back to a waiting head), and lets higher-priority heads preempt.
"""

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
