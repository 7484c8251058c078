"""One worker's part in a job, whoever owns the training loop: the runtime's `Trainer` or a script of
the user's own through `hetero_runtime.wrap`. Both open it with `WorkerSession.open`, so they share
one lifecycle and cannot drift apart:

- the process group (opened even for one process, so that a script's own `dist.get_rank()` works)
  and this worker's device;
- every rank's device facts, gathered once, from which every rank derives the same job precision;
- the worker's metrics endpoint and its simulated speed (with the speed file a slowed node rewrites);
- on rank 0, the plan tracker; every rank receives the plan rank 0 chose for an epoch;
- the stop requests (SIGTERM, the operator's checkpoint annotation) and the divergence guard's
  settings.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Self

import torch.distributed as dist

from hetero_operator.plan import Plan, Strategy
from hetero_runtime.device import PlacedRank, Placement, place_worker
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.plan_client import PlanTracker, plan_source_from_spec
from hetero_runtime.precision import JobPrecision, MixedPrecision, RankFacts, job_precision, rank_facts
from hetero_runtime.simulate import SpeedSimulator
from hetero_runtime.stopping import StopRequests

log = logging.getLogger(__name__)

PROCESS_GROUP_TIMEOUT = timedelta(seconds=120)


class SessionError(RuntimeError):
    """The process group does not match the worker's environment; the message names the fix."""


def broadcast_object(value: Any, world_size: int) -> Any:
    """Rank 0's `value` on every rank."""
    if world_size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


def gather_objects(value: Any, world_size: int) -> list[Any]:
    """Every rank's `value`, by rank, on every rank."""
    if world_size == 1:
        return [value]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered


def open_process_group(env: WorkerEnv, placement: Placement) -> None:
    """Open the job's process group unless the script opened it already (then it must match)."""
    if not dist.is_initialized():
        # One process needs no rendezvous (and no port that another job may hold).
        rendezvous: dict[str, Any] = (
            {"init_method": env.init_method} if env.world_size > 1 else {"store": dist.HashStore()}
        )
        dist.init_process_group(
            placement.backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=PROCESS_GROUP_TIMEOUT,
            device_id=placement.device if placement.backend == "nccl" else None,
            **rendezvous,
        )
    if (dist.get_rank(), dist.get_world_size()) != (env.rank, env.world_size):
        raise SessionError(
            f"the process group has rank {dist.get_rank()} of {dist.get_world_size()} but RANK={env.rank} "
            f"and WORLD_SIZE={env.world_size}: open it from the same environment, or let the runtime open it"
        )


@dataclass
class WorkerSession(PlacedRank):
    env: WorkerEnv
    placement: Placement
    metrics: WorkerMetrics
    simulator: SpeedSimulator
    tracker: PlanTracker | None
    stop: StopRequests
    ranks: tuple[RankFacts, ...]
    """Every rank's device and requested precision, by rank (the same on every rank)."""

    @classmethod
    def open(cls, env: WorkerEnv, **more: Any) -> Self:
        """Join the job: process group, device, metrics, simulated speed, plan tracker (rank 0).
        A collective: every rank opens its session at the same point."""
        placement = place_worker(env)
        open_process_group(env, placement)
        metrics = WorkerMetrics(env.job_name, env.rank, env.gpu_class)
        simulator = SpeedSimulator(env.simulated_speed, env.simulated_speed_file)
        metrics.set_simulated_speed(simulator.speed)
        simulator.announce(env.rank)
        if env.metrics_port is not None:
            # Each pod has its own address; binding to it lets pods share a host without port clashes.
            metrics.serve(env.metrics_port, addr=env.pod_ip or "0.0.0.0")
        tracker = None
        if env.rank == 0 and env.plan_source is not None:
            tracker = PlanTracker(plan_source_from_spec(env.plan_source), env.world_size)
        ranks = tuple(gather_objects(rank_facts(placement.device, env.precision), env.world_size))
        return cls(
            env=env,
            placement=placement,
            metrics=metrics,
            simulator=simulator,
            tracker=tracker,
            stop=StopRequests(env.annotations_file),
            ranks=ranks,
            **more,
        )

    def job_precision(self, strategy: Strategy) -> JobPrecision:
        """The job's precision under `strategy` (pure: every rank finds the same)."""
        return job_precision(self.ranks, strategy)

    def mixed_precision(self, strategy: Strategy) -> MixedPrecision:
        """This rank's part of the job's precision under `strategy`."""
        job = self.job_precision(strategy)
        if self.rank == 0:
            log.info("precision: %s", job.describe())
        return MixedPrecision(job.ranks[self.rank], self.device, job.loss_scaled)

    def agreed_plan(self, epoch: int, current: Plan | None, fallback: Plan) -> Plan:
        """Rank 0 reads the newest plan for `epoch` (or keeps `current`, or takes `fallback` when it
        has none); every rank receives the same one."""
        text = None
        if self.rank == 0:
            chosen = self.tracker.plan_for_epoch(epoch) if self.tracker is not None else current
            if chosen is None:
                chosen = current or fallback
                if self.tracker is not None:
                    self.tracker.current = chosen
                    log.warning("no valid plan from the source; running plan version %d", chosen.version)
            text = chosen.to_json()
        return Plan.from_json(broadcast_object(text, self.world_size))

    def keep_plan(self, plan: Plan | None) -> None:
        """After a restart: rank 0's tracker runs the checkpoint's plan until a newer one arrives
        (None: the checkpoint's plan does not fit this world)."""
        if self.tracker is not None:
            self.tracker.current = plan

    def close(self, together: bool = True) -> None:
        """Leave the process group; `together`: all ranks at once, after a barrier (a rank that tears
        gloo down while a peer still works may abort at exit). Not after a failure, when a peer may
        never reach the barrier."""
        if dist.is_initialized():
            if together and dist.get_world_size() > 1:
                dist.barrier()
            dist.destroy_process_group()
