"""HeteroDataLoader: each rank's planned share of every global batch, re-split when a new plan arrives.

It takes the place of a DistributedSampler and a DataLoader. `batch_size` is the global batch B,
split over the ranks by the plan in force at the start of each epoch (evenly until a plan arrives);
the order of an epoch depends only on (seed, epoch), so every rank agrees on it and a position
(epoch, samples consumed) survives a restart under another plan. Collation, worker processes and
pinned memory are PyTorch's own DataLoader's, fed with this rank's indices; on a GPU the next batch is
copied while this one computes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, default_collate

from hetero_operator.plan import Plan, Strategy
from hetero_runtime.device import to_device
from hetero_runtime.metrics import StepRecord
from hetero_runtime.plan_refusals import own_shuffle_refusal
from hetero_runtime.prefetch import staged
from hetero_runtime.sampler import SamplerPosition, UnevenBatchSampler, step_sizes
from hetero_runtime.strategies.esync import OwnStream
from hetero_runtime.trainer import default_plan
from hetero_runtime.wrap.esync_rounds import ESyncRounds
from hetero_runtime.wrap.refusals import dataset_refusal, is_stream
from hetero_runtime.wrap.report import EpochRecord, RunRecord
from hetero_runtime.wrap.session import Session, StepShare, WrapperError, current_session
from hetero_runtime.wrap.stream import stream_steps

STAND_IN_INDEX = 0
"""A rank with no sample in a step (a short last batch split in proportion) still runs the step, so
that the all-reduce meets every rank: it computes on this one sample and its gradient counts zero."""


def rank_batches(
    sampler: UnevenBatchSampler, position: SamplerPosition, local_batches: list[int]
) -> tuple[list[list[int]], list[list[int]]]:
    """This rank's indices per step (stand-ins where it has none) and every rank's counts per step."""
    indices, sizes = [], []
    for step in sampler.epoch(position, local_batches):
        own = [int(i) for i in step.indices]
        indices.append(own or [STAND_IN_INDEX])
        sizes.append(step.sizes)
    return indices, sizes


class HeteroDataLoader:
    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool | None = None,
        move_to_device: bool = True,
        seed: int | None = None,
        session: Session | None = None,
    ) -> None:
        refusal = dataset_refusal(dataset, num_workers)
        if refusal is not None:
            raise WrapperError(refusal)
        if not isinstance(batch_size, int) or batch_size < 1:
            raise WrapperError(
                f"HeteroDataLoader(batch_size={batch_size!r}): give the global batch, a positive integer "
                "(the sum of every rank's batch, not one rank's)"
            )
        self.session = session or current_session()
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.pin_memory = self.session.placement.pin_memory if pin_memory is None else pin_memory
        self.move_to_device = move_to_device
        env = self.session.env
        self.stream = is_stream(dataset)
        # A stream's order is its own (the same on every rank): only indexed datasets are shuffled here.
        self.seed = env.seed if seed is None else seed
        self.sampler = None if self.stream else UnevenBatchSampler(len(dataset), env.rank, self.seed)
        self.position = SamplerPosition(0, 0)
        self.record = RunRecord(env.rank, env.world_size)
        # Read now, so that len(loader) and local_batch hold before the first epoch (a OneCycleLR
        # built before the loop needs its steps per epoch); every epoch reads it again.
        self.session.plan_for_epoch(0, batch_size)

    @property
    def epoch(self) -> int:
        return self.position.epoch

    def set_epoch(self, epoch: int) -> None:
        """Optional, as with a DistributedSampler: the loader counts epochs itself."""
        if epoch != self.position.epoch:
            self.position = SamplerPosition(epoch, 0)

    @property
    def plan(self) -> Plan:
        return self.session.plan or default_plan(self.session.world_size, self.batch_size, Strategy.DATA)

    @property
    def local_batch(self) -> int:
        """This rank's planned batch under the plan in force."""
        return self.plan.local_batches[self.session.rank]

    def __len__(self) -> int:
        """Steps in the current epoch under the plan in force (the same on every rank)."""
        if self.sampler is None:
            if not hasattr(self.dataset, "__len__"):
                raise TypeError(
                    f"len(HeteroDataLoader): the {type(self.dataset).__name__} stream has no __len__, so "
                    "its steps per epoch are unknown until it ends: give it __len__ to ask in advance"
                )
            return sum(1 for _ in step_sizes(len(self.dataset), 0, self.plan.local_batches))
        return self.sampler.steps_in_epoch(SamplerPosition(self.epoch, 0), self.plan.local_batches)

    def _epoch_over(self) -> bool:
        """The script left the last epoch right after its last batch (a stream's end shows only when
        read: then the next pass finds it empty and ends at once)."""
        return self.sampler is not None and self.position.consumed >= len(self.dataset)

    def _batches(self, local_batches: list[int]) -> Iterator[tuple[list[int], Any]]:
        """(every rank's count, this rank's collated batch) per step, from the current position."""
        if self.sampler is None:
            set_epoch = getattr(self.dataset, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(self.position.epoch)  # a stream that reshuffles per epoch, in step on every rank
            collate = self.collate_fn or default_collate
            for step in stream_steps(self.dataset, self.position.consumed, local_batches, self.session.rank):
                yield step.sizes, collate(step.samples)
            return
        indices, sizes = rank_batches(self.sampler, self.position, local_batches)
        loader = DataLoader(
            self.dataset,
            batch_sampler=indices,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )
        yield from zip(sizes, loader, strict=True)

    def __iter__(self) -> Iterator[Any]:
        if self._epoch_over():
            self.position = SamplerPosition(self.position.epoch + 1, 0)
        session, epoch = self.session, self.position.epoch
        plan = session.plan_for_epoch(epoch, self.batch_size)
        session.run_pending_averaging()
        self.record.plan_applied(epoch, plan.version)
        session.metrics.set_epoch(epoch)
        started, samples, steps, covered = time.perf_counter(), 0, 0, 0
        started_at = self.position.consumed
        rank = session.rank
        if plan.strategy is Strategy.ESYNC:
            refusal = own_shuffle_refusal(plan, self.sampler is not None)
            if refusal is not None:
                raise WrapperError(refusal)
            rounds = session.esync_rounds(plan)
            rounds_before = rounds.round
            for local, batch in self._esync_steps(plan, rounds):
                samples += local
                steps += 1
                yield batch
            extra = {"rounds": float(rounds.round - rounds_before)}
            covered = (
                self.position.consumed - started_at
            )  # every round's samples, the last one's past the end
        else:
            steps_ahead = self._batches(plan.local_batches)
            if self.move_to_device:
                device, pin = session.device, self.pin_memory
                steps_ahead = staged(
                    steps_ahead, lambda step: (step[0], to_device(step[1], device, pin)), device
                )
            for sizes, batch in steps_ahead:
                self._finish_step()
                session.step = StepShare(sizes[rank], sizes)
                session.step_started = session.simulator.begin()
                # Counted as consumed once handed out: a checkpoint the script saves after this step's
                # optimizer step resumes after it.
                self.position = SamplerPosition(epoch, self.position.consumed + sum(sizes))
                samples += sizes[rank]
                covered += sum(sizes)
                steps += 1
                yield batch
            extra = {}
        self._finish_step()
        session.step = session.step_started = None
        averaging = session.step_averaging()
        if averaging is not None:
            averaging.end_epoch()  # one model again for evaluation, checkpoints and the next plan
        if session.guard is not None:
            session.guard.at_epoch_end(epoch)
        estimate = session.noise.estimate
        if estimate is not None:
            extra["gradient_noise_scale"] = estimate.noise_scale
            session.metrics.set_noise_scale(estimate.noise_scale)
        record = EpochRecord(
            epoch,
            plan.version,
            plan.local_batches[rank],
            samples,
            steps,
            time.perf_counter() - started,
            extra,
            plan.strategy.value,
            covered,
        )
        self.position = SamplerPosition(epoch + 1, 0)
        self.record.epoch_done(record, session.env.epochs, session.env.result_file)

    def _esync_steps(self, plan: Plan, rounds: ESyncRounds) -> Iterator[tuple[int, Any]]:
        """`esync`: this rank's planned batch per step from its own shuffle, until the rounds together
        have used an epoch's samples. The position moves at each round's end only: a checkpoint saved
        inside a round resumes at the round's start (see `esync_rounds`)."""
        session, epoch = self.session, self.position.epoch
        local = plan.local_batches[session.rank]
        size = len(self.dataset)
        stream = OwnStream(size, self.seed, epoch, session.rank)
        collate = self.collate_fn or default_collate
        while self.position.consumed < size:
            batch = collate([self.dataset[int(i)] for i in stream.take(local)])
            if self.move_to_device:
                batch = to_device(batch, session.device, self.pin_memory)
            session.step = StepShare(local, plan.local_batches)
            started = session.step_started = session.simulator.begin()
            yield local, batch
            # The script's step is over (its optimizer step too): another, or the round's end.
            compute = session.pending_timing[0] if session.pending_timing is not None else 0.0
            session.pending_timing = None
            step_seconds = time.perf_counter() - started.wall
            used = rounds.after_step(step_seconds, local)
            total = time.perf_counter() - started.wall
            session.metrics.record_step(StepRecord(compute, step_seconds, total - step_seconds, total, local))
            if used is not None:
                session.metrics.set_local_steps(rounds.last_round_steps)
                self.position = SamplerPosition(epoch, self.position.consumed + used)
            session.step = session.step_started = None

    def _finish_step(self) -> None:
        """End the step just done, once its optimizer step is over too: the local-step strategies'
        averaging, then the step's measurements."""
        session = self.session
        if session.step is None or session.step_started is None:
            return
        averaging = session.step_averaging()
        averaged = 0.0
        if averaging is not None:
            began = time.perf_counter()
            averaging.after_step(session.step.sizes)
            averaged = time.perf_counter() - began
        if session.guard is not None:
            # Under the local-step strategies the replicas differ until the epoch's end.
            session.guard.after_step(self.position.epoch, compare=averaging is None)
        if session.pending_timing is None:
            return
        compute, until_sync, comm = session.pending_timing
        session.pending_timing = None
        total = time.perf_counter() - session.step_started.wall
        record = StepRecord(compute, until_sync, comm + averaged, total, session.step.local_batch)
        session.metrics.record_step(record)

    def state_dict(self) -> dict[str, Any]:
        plan = self.session.plan
        return {
            "epoch": self.position.epoch,
            "consumed": self.position.consumed,
            "plan": plan.to_json() if plan is not None else None,
            "plan_history": [list(item) for item in self.record.plan_history],
            "averaging_steps": self.session.averaging_steps,
            # Saved inside a step (after its optimizer step): that step's averaging is still to come.
            "averaging_pending": (
                list(self.session.step.sizes)
                if self.session.step is not None and self.session.local_steps
                else None
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = SamplerPosition(int(state["epoch"]), int(state["consumed"]))
        if state.get("plan"):
            self.session.restore_plan(Plan.from_json(state["plan"]))
        self.record.plan_history = [(int(e), int(v)) for e, v in state.get("plan_history", [])]
        pending = state.get("averaging_pending")
        if pending is True:  # saved before the sizes were kept: the plan's split
            pending = list(self.plan.local_batches)
        self.session.restore_averaging_steps(
            int(state.get("averaging_steps", 0)), list(pending) if isinstance(pending, list) else None
        )
