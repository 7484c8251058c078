"""One worker's part in a job whose training loop is the user's: the runtime's `WorkerSession` (process
group, device, the job's precision, metrics, simulated speed, plan tracking, stop requests), plus
what the wrapper tracks of the step in progress.

`init()` is the one call a script makes before building its model and loader; the model wrapper and
the data loader find the session it opened through `current_session()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import NoReturn

import torch
from torch import nn

from hetero_operator.plan import ESyncParams, Plan, Strategy
from hetero_runtime.divergence import DivergenceGuard
from hetero_runtime.exiting import end_now
from hetero_runtime.gns import NoiseTracker
from hetero_runtime.launcher import WorkerEnv, worker_env_from_os
from hetero_runtime.plan_client import PlanSourceError, PlanTracker
from hetero_runtime.plan_refusals import strategy_refusal
from hetero_runtime.precision import MixedPrecision, PrecisionError
from hetero_runtime.simulate import RecentPace, Stopwatch
from hetero_runtime.trainer import default_plan
from hetero_runtime.worker_session import SessionError, WorkerSession, broadcast_object
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
class Session(WorkerSession):
    plan: Plan | None = None
    step: StepShare | None = None
    step_started: Stopwatch | None = None  # when the loader handed out the step's batch
    pending_timing: tuple[float, float, float] | None = None  # compute, until sync, sync seconds
    noise: NoiseTracker = field(default_factory=NoiseTracker)
    base: RecentPace = field(default_factory=RecentPace)  # what a simulated device's pace is based on
    model: nn.Module | None = None  # the module HeteroModel wraps: what local-step strategies average
    _averaging: ParameterAveraging | None = None
    _averaging_version: int | None = None
    _restored_averaging_steps: int = 0  # from a checkpoint: where the averaging schedule resumes
    _averaging_pending: list[int] | None = None  # the sizes of a checkpoint's step not averaged yet
    _rounds: ESyncRounds | None = None
    strategy: Strategy = Strategy.DATA  # the job's, from its plan at the start
    guard: DivergenceGuard | None = None  # over the model HeteroModel wraps
    _amp: MixedPrecision | None = None
    _scaler: torch.amp.GradScaler | None = None

    @property
    def amp(self) -> MixedPrecision:
        """This rank's part of the job's precision (see `hetero_runtime.precision`)."""
        if self._amp is None:
            self._amp = self.mixed_precision(self.strategy)
        return self._amp

    def grad_scaler(self) -> torch.amp.GradScaler:
        """The job-wide loss scaler where the job's precision scales its loss, else a disabled one
        (which passes everything through): the same object on every call."""
        if self._scaler is None:
            self._scaler = self.amp.scaler or torch.amp.GradScaler(self.device.type, enabled=False)
        return self._scaler

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

    def close(self, together: bool = True) -> None:
        if self._rounds is not None:
            self._rounds.close()
            self._rounds = None
        super().close(together)

    def plan_for_epoch(self, epoch: int, global_batch: int) -> Plan:
        """Rank 0 reads the newest applicable plan; every rank receives the same one. Without a plan
        source the split is even over the loader's batch size."""
        fallback = default_plan(self.world_size, global_batch, Strategy.DATA)
        plan = self.agreed_plan(epoch, self.plan, fallback)
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

    def restore_averaging_steps(self, steps: int, pending: list[int] | None) -> None:
        """After a restart: the schedules go on from the checkpoint's step, as if never stopped;
        `pending`: every rank's samples in the checkpoint's last step, when it had not been averaged
        yet (the script saved after its optimizer step), so that averaging runs before the first step
        after the restart."""
        self._restored_averaging_steps = steps
        self._averaging_pending = pending
        if self._averaging is not None:
            self._averaging.steps = steps

    def run_pending_averaging(self) -> None:
        sizes, self._averaging_pending = self._averaging_pending, None
        if sizes is not None:
            averaging = self.step_averaging()
            if averaging is not None:
                averaging.after_step(sizes)

    def restore_plan(self, plan: Plan) -> None:
        """After a restart: keep running the checkpoint's plan until a newer one arrives."""
        if plan.fits_world(self.world_size) is not None:
            return
        self.plan = plan
        self.keep_plan(plan)


_session: Session | None = None


def init(env: WorkerEnv | None = None) -> Session:
    """Join the job: the process group (unless the script opened it), this worker's device, its
    metrics endpoint and, on rank 0, the plan source. Call it once, where a DDP script calls
    `dist.init_process_group`; calling it again returns the same session."""
    global _session
    if _session is not None:
        return _session
    env = env or worker_env_from_os()
    try:
        session = Session.open(env)
    except SessionError as error:
        raise WrapperError(str(error)) from None
    refusal, strategy = broadcast_object(starting_plan(session.tracker), env.world_size)
    if refusal is not None:
        raise WrapperError(refusal)
    session.strategy = strategy
    try:  # resolved now, so that a precision some rank's device cannot run is refused at once
        log.info("rank %d computes in %s", env.rank, session.amp.precision.value)
    except PrecisionError as error:
        raise WrapperError(str(error)) from None
    _session = session
    return _session


def starting_plan(tracker: PlanTracker | None) -> tuple[str | None, Strategy]:
    """The plan at the start, on rank 0: why this loop cannot run it (refused at once, even if the
    script never builds a loader), and the job's strategy (data when no plan can be read yet)."""
    if tracker is None or tracker.source is None:
        return None, Strategy.DATA
    try:
        plan = Plan.from_json(tracker.source.read())
    except (PlanSourceError, ValueError):
        return None, Strategy.DATA  # unreadable now: the loader reads it again at every epoch
    return strategy_refusal(plan), plan.strategy


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
    _session = None


def leave() -> NoReturn:
    """The script's last call: leave the job with every rank (`close()`), then end the process at
    once, with exit code 0 (`end_now` says why)."""
    close()
    end_now()
