"""The worker's main loop: process group, plan at every epoch boundary, strategy epochs, checkpoints."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from hetero_operator.plan import Plan, Strategy, even_local_batches
from hetero_runtime import checkpoint
from hetero_runtime.calibration import calibrate_solo
from hetero_runtime.divergence import DivergenceGuard
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.progress import emit_progress
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.stopping import STOPPED_EXIT_CODE, agree
from hetero_runtime.strategies import build_strategy
from hetero_runtime.strategies.base import EpochStats, EvaluateFn, TrainingStrategy, WorkerContext, trainable
from hetero_runtime.worker_session import WorkerSession

log = logging.getLogger(__name__)


@dataclass
class EpochReport:
    epoch: int
    plan_version: int
    local_batch: int
    loss: float
    samples: int
    steps: int
    compute_seconds: float
    comm_seconds: float
    wall_seconds: float
    evaluation: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    # Samples every rank trained on together in the epoch (the sampler's range it covered): with a
    # short last step this is less than steps x the global batch.
    global_samples: int = 0


@dataclass
class TrainingResult:
    rank: int
    world_size: int
    strategy: str
    resumed_from_epoch: int | None
    epochs: list[EpochReport]
    plan_history: list[tuple[int, int]]  # (epoch, plan version) at every change
    final_evaluation: dict[str, float]
    stopped: str | None = None  # why training stopped early (after its checkpoint), if it did
    stopped_at: dict[str, int] | None = None  # the sampler position it stopped at
    precision: str = "fp32"
    device: str = "cpu"
    simulated_costs: dict[str, float] = field(default_factory=dict)
    simulated_overrun_share: float = 0.0


ANOTHER_RANKS_REQUEST = "another rank's stop request"


@dataclass(frozen=True)
class Reached:
    """Where training stands, as a checkpoint records it."""

    epochs_done: int
    position: SamplerPosition
    plan: Plan
    history: list[tuple[int, int]]


class WorkerStopped(SystemExit):
    """Training stopped on request (SIGTERM or the operator's annotation) after its checkpoint: the
    worker process ends with STOPPED_EXIT_CODE."""

    def __init__(self, reason: str) -> None:
        super().__init__(STOPPED_EXIT_CODE)
        self.reason = reason


def default_plan(world_size: int, global_batch: int, strategy: Strategy) -> Plan:
    """Even split when no plan source is configured (a single process or a quick local run)."""
    return Plan(
        version=0,
        strategy=strategy,
        world_size=world_size,
        global_batch=global_batch,
        local_batches=even_local_batches(global_batch, world_size),
    )


class Trainer:
    def __init__(
        self,
        env: WorkerEnv,
        ctx_parts: dict[str, Any],
        epochs: int,
        global_batch: int,
        strategy: Strategy,
        evaluate: EvaluateFn | None,
        strategy_options: dict[str, Any],
    ) -> None:
        self.env = env
        self.epochs = env.epochs or epochs
        self.fallback = default_plan(env.world_size, global_batch, strategy)
        self.evaluate = evaluate
        self.ctx_parts = ctx_parts
        self.strategy_options = strategy_options

    def run(self) -> TrainingResult:
        session = WorkerSession.open(self.env)
        session.stop.install_signal_handler()
        self.session = session
        model = self.ctx_parts["model"]
        model.to(session.device)  # in place: the optimizer's parameters are the same objects
        self.ctx = WorkerContext(
            env=self.env,
            metrics=session.metrics,
            simulator=session.simulator,
            sampler=UnevenBatchSampler(len(self.ctx_parts["dataset"]), self.env.rank, self.env.seed),
            placement=session.placement,
            stop=session.stop,
            guard=DivergenceGuard(trainable(model), self.env.world_size, session.device),
            **self.ctx_parts,
        )
        try:
            return self._train()
        finally:
            session.close(together=False)  # a failed peer may never reach a barrier

    def _train(self) -> TrainingResult:
        env, ctx = self.env, self.ctx
        resumed = self._load_checkpoint()
        start_epoch, position = 0, SamplerPosition(0, 0)
        plan: Plan | None = None
        history: list[tuple[int, int]] = []
        if resumed is not None:
            start_epoch = resumed["epochs_done"]
            position = SamplerPosition(**resumed["position"])
            saved_plan = Plan.from_json(resumed["plan"])
            if saved_plan.fits_world(env.world_size) is None:
                plan = saved_plan
            history = [(int(epoch), int(version)) for epoch, version in resumed["plan_history"]]
            self.session.keep_plan(plan)
        plan = self.session.agreed_plan(start_epoch, plan, self.fallback)
        # The job's precision depends on the strategy the plan runs (see `precision`).
        ctx.amp = self.session.mixed_precision(plan.strategy)
        strategy = build_strategy(plan.strategy, ctx, self.strategy_options)
        if ctx.simulator.active:
            ctx.costs = calibrate_solo(strategy, plan, ctx)
        if resumed is not None:
            strategy.load_state_dict(resumed["strategy"])
        strategy.start(plan)
        if not history or history[-1][1] != plan.version:
            history.append((start_epoch, plan.version))

        reports: list[EpochReport] = []
        try:
            stopped_at = self._epochs(strategy, plan, start_epoch, position, history, reports)
            if env.world_size > 1:
                # Rank 0 stops the strategy's side services (ESync's state service, HetPipe's parameter
                # server) in close(): a slower rank may still be sending its last message to them.
                dist.barrier()
        finally:
            strategy.close()
        result = TrainingResult(
            rank=env.rank,
            world_size=env.world_size,
            strategy=plan.strategy.value,
            resumed_from_epoch=start_epoch if resumed is not None else None,
            epochs=reports,
            plan_history=history,
            final_evaluation=reports[-1].evaluation if reports else {},
            stopped=(ctx.stop.reason or ANOTHER_RANKS_REQUEST) if stopped_at is not None else None,
            stopped_at=asdict(stopped_at) if stopped_at is not None else None,
            precision=ctx.amp.precision.value,
            device=str(ctx.device),
            simulated_costs=ctx.costs,
            simulated_overrun_share=ctx.simulator.overrun_share,
        )
        if env.result_file is not None:
            env.result_file.parent.mkdir(parents=True, exist_ok=True)
            env.result_file.write_text(json.dumps(asdict(result), indent=2))
        return result

    def _epochs(
        self,
        strategy: TrainingStrategy,
        plan: Plan,
        start_epoch: int,
        position: SamplerPosition,
        history: list[tuple[int, int]],
        reports: list[EpochReport],
    ) -> SamplerPosition | None:
        """Train the remaining epochs into `reports`; the position stopped at, if a stop was agreed."""
        env, ctx = self.env, self.ctx
        for epoch in range(start_epoch, self.epochs):
            if epoch > start_epoch:
                new_plan = self.session.agreed_plan(epoch, plan, self.fallback)
                if new_plan.version != plan.version:
                    plan = new_plan
                    strategy.apply_plan(plan)
                    history.append((epoch, plan.version))
            if position.epoch != epoch:
                position = SamplerPosition(epoch, 0)
            ctx.metrics.set_epoch(epoch)
            ctx.metrics.set_plan_version(plan.version)
            started_at = position.consumed
            stats = strategy.run_epoch(position, plan)
            ended_at = stats.stopped_at.consumed if stats.stopped_at is not None else ctx.sampler.dataset_size
            covered = ended_at - started_at
            if ctx.guard is not None and stats.stopped_at is None:
                ctx.guard.at_epoch_end(epoch)  # after the strategy's averaging: one model on every rank
            if stats.stopped_at is not None:
                reports.append(self._report(epoch, plan, stats, {}, covered))
                self._stop(strategy, Reached(epoch, stats.stopped_at, plan, history), stats.steps)
                return stats.stopped_at
            position = SamplerPosition(epoch + 1, 0)
            report = self._report(epoch, plan, stats, self._evaluate(strategy), covered)
            reports.append(report)
            done = epoch + 1
            stop = done < self.epochs and agree(ctx.stop.requested(), env.world_size, ctx.device)
            reached = Reached(done, position, plan, history)
            if stop or done % env.checkpoint_every_epochs == 0 or done == self.epochs:
                self._save_checkpoint(strategy, reached)
            if env.rank == 0:
                emit_progress({**asdict(report), "epoch": done, "epochs": self.epochs})
            if stop:
                self._stop(strategy, reached, saved=True)
                return position
        return None

    def _report(
        self, epoch: int, plan: Plan, stats: EpochStats, evaluation: dict[str, float], global_samples: int
    ) -> EpochReport:
        measured = {key: value for key, value in asdict(stats).items() if key != "stopped_at"}
        local_batch = plan.local_batches[self.env.rank]
        return EpochReport(
            epoch, plan.version, local_batch, evaluation=evaluation, global_samples=global_samples, **measured
        )

    def _stop(
        self, strategy: TrainingStrategy, reached: Reached, steps: int = 0, saved: bool = False
    ) -> None:
        """Every rank agreed to stop after the same step: save there, then leave together."""
        if not saved:
            self._save_checkpoint(strategy, reached)
        log.warning(
            "stopping on request (%s) at epoch %d after %d samples of it (%d steps run here); "
            "checkpoint saved",
            self.ctx.stop.reason or ANOTHER_RANKS_REQUEST,
            reached.position.epoch,
            reached.position.consumed,
            steps,
        )
        if self.env.world_size > 1:
            dist.barrier()  # nobody tears the process group down while rank 0 still writes

    def _evaluate(self, strategy: TrainingStrategy) -> dict[str, float]:
        model = strategy.evaluation_model()
        if self.evaluate is None or model is None:
            return {}
        model.eval()
        with torch.no_grad():
            values = self.evaluate(model)
        model.train()
        return {key: float(value) for key, value in values.items()}

    def _load_checkpoint(self) -> dict[str, Any] | None:
        path, state = checkpoint.restore_newest(self.env.checkpoint_dir, self.env.rank, self.env.world_size)
        if path is not None and state is not None:
            consumed = state["position"]["consumed"]
            log.info(
                "resuming from %s (%d epochs done)%s",
                path,
                state["epochs_done"],
                f", {consumed} samples into epoch {state['epochs_done']}" if consumed else "",
            )
        if state is None:
            return None
        self.ctx.model.load_state_dict(state["model"])
        self.ctx.optimizer.load_state_dict(state["optimizer"])
        # On every rank: only rank 0 reads the file, the others start from the state it sent.
        log.info(
            "resumed at epoch %d, %d samples into it (state %s)",
            state["position"]["epoch"],
            state["position"]["consumed"],
            "read from the checkpoint" if path is not None else "received from rank 0",
        )
        return state

    def _save_checkpoint(self, strategy: TrainingStrategy, reached: Reached) -> None:
        if self.env.checkpoint_dir is None or self.env.rank != 0:
            return
        started = time.perf_counter()
        model = strategy.evaluation_model()
        assert model is not None, "rank 0 holds the full model at an epoch boundary and after a stop"
        state = {
            "epochs_done": reached.epochs_done,
            "position": asdict(reached.position),
            "model": model.state_dict(),
            "optimizer": self.ctx.optimizer.state_dict(),
            "strategy": strategy.state_dict(),
            "plan": reached.plan.to_json(),
            "plan_history": reached.history,
        }
        path = checkpoint.checkpoint_path(
            self.env.checkpoint_dir, reached.epochs_done, reached.position.consumed
        )
        checkpoint.save_atomic(state, path)
        log.info("checkpoint %s written in %.3fs", path.name, time.perf_counter() - started)
