"""The worker's main loop: process group, plan at every epoch boundary, strategy epochs, checkpoints."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from hetero_operator.plan import Plan, Strategy, even_local_batches
from hetero_runtime import checkpoint
from hetero_runtime.calibration import calibrate_solo
from hetero_runtime.device import place_worker
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.metrics import WorkerMetrics
from hetero_runtime.plan_client import PlanTracker, plan_source_from_spec
from hetero_runtime.precision import mixed_precision
from hetero_runtime.progress import emit_progress
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler
from hetero_runtime.simulate import SpeedSimulator
from hetero_runtime.stopping import STOPPED_EXIT_CODE, StopRequests, agree
from hetero_runtime.strategies import build_strategy
from hetero_runtime.strategies.base import EpochStats, EvaluateFn, TrainingStrategy, WorkerContext

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


def _broadcast_object(value: Any, world_size: int) -> Any:
    if world_size == 1:
        return value
    holder = [value]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]


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
        placement = place_worker(env)
        model = ctx_parts["model"]
        model.to(placement.device)  # in place: the optimizer's parameters are the same objects
        metrics = WorkerMetrics(env.job_name, env.rank, env.gpu_class)
        simulator = SpeedSimulator(env.simulated_speed, env.simulated_speed_file)
        metrics.set_simulated_speed(simulator.speed)
        self.ctx = WorkerContext(
            env=env,
            metrics=metrics,
            simulator=simulator,
            sampler=UnevenBatchSampler(len(ctx_parts["dataset"]), env.rank, env.seed),
            placement=placement,
            stop=StopRequests(env.annotations_file),
            **ctx_parts,
        )
        self.strategy_options = strategy_options

    def run(self) -> TrainingResult:
        env, placement = self.env, self.ctx.placement
        self.ctx.stop.install_signal_handler()
        if env.world_size > 1 and not dist.is_initialized():
            dist.init_process_group(
                placement.backend,
                init_method=env.init_method,
                rank=env.rank,
                world_size=env.world_size,
                timeout=timedelta(seconds=120),
                device_id=placement.device if placement.backend == "nccl" else None,
            )
        try:
            return self._train()
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()

    def _train(self) -> TrainingResult:
        env, ctx = self.env, self.ctx
        ctx.simulator.announce(env.rank)
        if env.metrics_port is not None:
            # Each pod has its own address; binding to it lets pods share a host without port clashes.
            ctx.metrics.serve(env.metrics_port, addr=env.pod_ip or "0.0.0.0")
        tracker = None
        if env.rank == 0 and env.plan_source is not None:
            tracker = PlanTracker(plan_source_from_spec(env.plan_source), env.world_size)

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
            if tracker is not None:
                tracker.current = plan
        plan = self._plan_for_epoch(tracker, plan, start_epoch)
        # Precision depends on the strategy the plan runs (loss scaling only where steps synchronise).
        ctx.amp = mixed_precision(env.precision, ctx.device, plan.strategy)
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
            stopped_at = self._epochs(strategy, plan, start_epoch, position, history, tracker, reports)
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
        tracker: PlanTracker | None,
        reports: list[EpochReport],
    ) -> SamplerPosition | None:
        """Train the remaining epochs into `reports`; the position stopped at, if a stop was agreed."""
        env, ctx = self.env, self.ctx
        for epoch in range(start_epoch, self.epochs):
            if epoch > start_epoch:
                new_plan = self._plan_for_epoch(tracker, plan, epoch)
                if new_plan.version != plan.version:
                    plan = new_plan
                    strategy.apply_plan(plan)
                    history.append((epoch, plan.version))
            if position.epoch != epoch:
                position = SamplerPosition(epoch, 0)
            ctx.metrics.set_epoch(epoch)
            ctx.metrics.set_plan_version(plan.version)
            stats = strategy.run_epoch(position, plan)
            if stats.stopped_at is not None:
                reports.append(self._report(epoch, plan, stats, {}))
                self._stop(strategy, Reached(epoch, stats.stopped_at, plan, history), stats.steps)
                return stats.stopped_at
            position = SamplerPosition(epoch + 1, 0)
            report = self._report(epoch, plan, stats, self._evaluate(strategy))
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

    def _report(self, epoch: int, plan: Plan, stats: EpochStats, evaluation: dict[str, float]) -> EpochReport:
        measured = {key: value for key, value in asdict(stats).items() if key != "stopped_at"}
        local_batch = plan.local_batches[self.env.rank]
        return EpochReport(epoch, plan.version, local_batch, evaluation=evaluation, **measured)

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

    def _plan_for_epoch(self, tracker: PlanTracker | None, current: Plan | None, epoch: int) -> Plan:
        """Rank 0 reads the newest plan; every rank receives the same one."""
        text = None
        if self.env.rank == 0:
            chosen = tracker.plan_for_epoch(epoch) if tracker is not None else current
            if chosen is None:
                chosen = current or self.fallback
                if tracker is not None:
                    tracker.current = chosen
                    log.warning("no valid plan from the source; running plan version %d", chosen.version)
                else:
                    log.info("no plan source configured; running an even split of %d", chosen.global_batch)
            text = chosen.to_json()
        text = _broadcast_object(text, self.env.world_size)
        return Plan.from_json(text)

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
