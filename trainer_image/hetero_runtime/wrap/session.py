"""One worker's part in a job whose training loop is the user's: process group, device, plan, metrics.

`init()` is the one call a script makes before building its model and loader; the model wrapper and
the data loader find the session it opened through `current_session()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import ESyncParams, Plan, Strategy
from hetero_runtime.device import Placement, place_worker
from hetero_runtime.exiting import end_now
from hetero_runtime.gns import NoiseTracker
from hetero_runtime.launcher import WorkerEnv, worker_env_from_os
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.plan_client import PlanSourceError, PlanTracker, plan_source_from_spec
from hetero_runtime.plan_refusals import strategy_refusal
from hetero_runtime.simulate import SpeedSimulator, Stopwatch
from hetero_runtime.trainer import default_plan
from hetero_runtime.wrap.averaging import LOCAL_STEP_STRATEGIES, ParameterAveraging, averaging_for
from hetero_runtime.wrap.esync_rounds import ESyncRounds

log = logging.getLogger(__name__)


class WrapperError(RuntimeError):
    """The script uses the wrapper in a way it cannot support; the message names what to change."""


@dataclass(frozen=True)
class StepShare:
    """What the loader handed this rank for the step in progress."""

    local_batch: int  # samples that count (0: the batch is a stand-in whose gradient is dropped)
    sizes: list[int]  # every rank's count this step


@dataclass
class Session:
    env: WorkerEnv
    placement: Placement
    metrics: WorkerMetrics
    simulator: SpeedSimulator
    tracker: PlanTracker | None
    plan: Plan | None = None
    step: StepShare | None = None
    step_started: Stopwatch | None = None  # when the loader handed out the step's batch
    pending_timing: tuple[float, float, float] | None = None  # compute, until sync, sync seconds
    noise: NoiseTracker = field(default_factory=NoiseTracker)
    model: nn.Module | None = None  # the module HeteroModel wraps: what local-step strategies average
    _averaging: ParameterAveraging | None = None
    _averaging_version: int | None = None
    _restored_averaging_steps: int = 0  # from a checkpoint: where the averaging schedule resumes
    _averaging_pending: bool = False  # the checkpoint was saved before its last step's averaging
    _rounds: ESyncRounds | None = None

    @property
    def local_steps(self) -> bool:
        """Whether each rank steps on its own gradient and the parameters are averaged afterwards."""
        return self.plan is not None and self.plan.strategy in LOCAL_STEP_STRATEGIES

    def step_averaging(self) -> ParameterAveraging | None:
        """The averaging that ends each step under the plan in force (rebuilt when a plan arrives)."""
        plan = self.plan
        if plan is None or plan.strategy not in LOCAL_STEP_STRATEGIES:
            return None
        if self._averaging is None or self._averaging_version != plan.version:
            if self.model is None:
                raise WrapperError(
                    f"strategy {plan.strategy.value!r} averages the model's parameters after every step: "
                    "wrap the model in heterotrain.HeteroModel(model) before the loader hands out a batch"
                )
            steps = self.averaging_steps
            self._averaging = averaging_for(self.model, plan, self.rank, steps)
            self._averaging_version = plan.version
        return self._averaging

    def esync_rounds(self, plan: Plan) -> ESyncRounds:
        """The job's `esync` rounds (the state service starts with the first; its settings stay)."""
        if self._rounds is None:
            if self.model is None:
                raise WrapperError(
                    "strategy 'esync' averages the model's parameters at the end of every round: wrap the "
                    "model in heterotrain.HeteroModel(model) before the loader hands out a batch"
                )
            self._rounds = ESyncRounds(self.env, self.model, plan.esync or ESyncParams())
        return self._rounds

    def close(self) -> None:
        if self._rounds is not None:
            self._rounds.close()
            self._rounds = None

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def device(self) -> torch.device:
        return self.placement.device

    def plan_for_epoch(self, epoch: int, global_batch: int) -> Plan:
        """Rank 0 reads the newest applicable plan; every rank receives the same one. Without a plan
        source the split is even over the loader's batch size."""
        text = None
        if self.rank == 0:
            chosen = self.tracker.plan_for_epoch(epoch) if self.tracker is not None else self.plan
            if chosen is None:
                chosen = self.plan or default_plan(self.world_size, global_batch, Strategy.DATA)
                if self.tracker is not None:
                    self.tracker.current = chosen
            text = chosen.to_json()
        plan = Plan.from_json(broadcast_object(text, self.world_size))
        refusal = strategy_refusal(plan)
        if refusal is not None:
            raise WrapperError(refusal)
        if plan.learning_rate_scale != 1.0 and (self.plan is None or self.plan.version != plan.version):
            log.warning(
                "plan version %d asks for learning-rate scale %g: your script owns its learning rate, "
                "scale it there if you want it",
                plan.version,
                plan.learning_rate_scale,
            )
        self.plan = plan
        self.metrics.set_plan_version(plan.version)
        return plan

    @property
    def averaging_steps(self) -> int:
        """Steps the local-step strategies' schedules have run (their groups and phases follow it)."""
        return self._averaging.steps if self._averaging is not None else self._restored_averaging_steps

    def restore_averaging_steps(self, steps: int, pending: bool) -> None:
        """After a restart: the schedules go on from the checkpoint's step, as if never stopped;
        `pending`: the checkpoint's last step had not been averaged yet (the script saved after its
        optimizer step), so that averaging runs before the first step after the restart."""
        self._restored_averaging_steps = steps
        self._averaging_pending = pending
        if self._averaging is not None:
            self._averaging.steps = steps

    def run_pending_averaging(self) -> None:
        if self._averaging_pending:
            self._averaging_pending = False
            averaging = self.step_averaging()
            if averaging is not None:
                averaging.after_step()

    def restore_plan(self, plan: Plan) -> None:
        """After a restart: keep running the checkpoint's plan until a newer one arrives."""
        if plan.fits_world(self.world_size) is not None:
            return
        self.plan = plan
        if self.tracker is not None:
            self.tracker.current = plan


def broadcast_object(value: Any, world_size: int) -> Any:
    if world_size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


_session: Session | None = None


def init(env: WorkerEnv | None = None) -> Session:
    """Join the job: the process group (unless the script opened it), this worker's device, its
    metrics endpoint and, on rank 0, the plan source. Call it once, where a DDP script calls
    `dist.init_process_group`; calling it again returns the same session."""
    global _session
    if _session is not None:
        return _session
    env = env or worker_env_from_os()
    placement = place_worker(env)
    if not dist.is_initialized():
        # Opened even for one process: the script's own dist.get_rank() and friends keep working.
        # One process needs no rendezvous (and no port that another job may hold).
        rendezvous: dict[str, Any] = (
            {"init_method": env.init_method} if env.world_size > 1 else {"store": dist.HashStore()}
        )
        dist.init_process_group(
            placement.backend,
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=120),
            device_id=placement.device if placement.backend == "nccl" else None,
            **rendezvous,
        )
    if dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) != (env.rank, env.world_size):
        raise WrapperError(
            f"the process group has rank {dist.get_rank()} of {dist.get_world_size()} but RANK={env.rank} "
            f"and WORLD_SIZE={env.world_size}: open it from the same environment, or let init() open it"
        )
    metrics = WorkerMetrics(env.job_name, env.rank, env.gpu_class)
    simulator = SpeedSimulator(env.simulated_speed)
    metrics.set_simulated_speed(simulator.speed)
    simulator.announce(env.rank)
    if env.metrics_port is not None:
        metrics.serve(env.metrics_port, addr=env.pod_ip or "0.0.0.0")
    tracker = None
    if env.rank == 0 and env.plan_source is not None:
        tracker = PlanTracker(plan_source_from_spec(env.plan_source), env.world_size)
    refusal = broadcast_object(starting_refusal(tracker), env.world_size)
    if refusal is not None:
        raise WrapperError(refusal)
    _session = Session(env, placement, metrics, simulator, tracker)
    return _session


def starting_refusal(tracker: PlanTracker | None) -> str | None:
    """Refuse at once a plan this loop cannot run, even if the script never builds a loader."""
    if tracker is None or tracker.source is None:
        return None
    try:
        plan = Plan.from_json(tracker.source.read())
    except (PlanSourceError, ValueError):
        return None  # unreadable now: the loader reads it again at every epoch
    return strategy_refusal(plan)


def current_session() -> Session:
    if _session is None:
        raise WrapperError(
            "hetero_runtime.wrap.init() has not been called: call it once at the start of the script, "
            "before building HeteroModel or HeteroDataLoader (where a DDP script calls "
            "dist.init_process_group)"
        )
    return _session


def close() -> None:
    """Leave the job: tear the process group down, all ranks together (a rank that tears gloo down
    while a peer still works may abort at exit). Optional; the process's exit does it too."""
    global _session
    if _session is not None:
        _session.close()
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
    _session = None


def leave() -> NoReturn:
    """The script's last call: leave the job with every rank (`close()`), then end the process at
    once, with exit code 0 (`end_now` says why)."""
    close()
    end_now()
