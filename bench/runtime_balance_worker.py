"""One worker of the runtime balance benchmark (started by bench/runtime_balance.py).

Phases, every rank in lockstep:
  calibrate  each rank in turn, alone, times its compute per sample; all take the slowest figure as
             the simulated base device (`hetero_runtime.calibration.common_costs`);
  solo       each rank in turn, alone, computes steps at its simulated speed: its solo speed;
  even       the even split plain DDP uses (A);
  rounds     rebalancing decided as the operator's rebalancer decides between epochs;
  data       the split the rounds settled on (B);
  prior      the split the GPUClass priors give (the product's first split with nothing measured);
  even-again the even split once more (A), so drift of the host between A and B shows;
  alone      the fastest worker (rank 0) alone with the whole global batch, no gradient exchange:
             what a user who drops the slower GPUs runs. Last, as it leaves the replicas apart.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional

from bench_workers import gather, join_gloo, seeded_model, step_means, worker_entry
from hetero_operator.plan import Plan
from hetero_operator.planner.batch import proportional_split
from hetero_operator.rebalance.decide import BatchPolicy, confirm, decide
from hetero_operator.rebalance.history import record
from hetero_operator.rebalance.measurements import JobMeasurements, WorkerMeasurement
from hetero_runtime.calibration import common_costs
from hetero_runtime.simulate import SpeedSimulator, Stopwatch, per_sample_seconds
from hetero_runtime.strategies.data import gradient_reducer, synchronize_gradients


def conv_net(channels: int) -> nn.Sequential:
    """A 1-D convolutional net: much compute per parameter, so a step is compute-bound as on GPUs."""
    return nn.Sequential(
        nn.Conv1d(8, channels, 5, padding=2),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 5, padding=2),
        nn.ReLU(),
        nn.Conv1d(channels, channels, 5, padding=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool1d(1),
        nn.Flatten(),
        nn.Linear(channels, 10),
    )


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        # A worker the scheduler moves between cores comes back to cold caches: each keeps its core.
        if config["worker_cores"] is not None:
            os.sched_setaffinity(0, {config["worker_cores"][self.rank]})
        torch.set_num_threads(1)
        torch.set_num_interop_threads(1)
        join_gloo(self.rank, self.world, 300)
        self.simulator = SpeedSimulator(float(os.environ["HETEROTRAIN_SIMULATED_SPEED"]))
        self.model = seeded_model(lambda: conv_net(32), torch.device("cpu"))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.params = list(self.model.parameters())
        self.reducer = gradient_reducer(self.params, self.rank, self.world)
        self.global_batch, self.chunk = config["global_batch"], config["micro_batch"]
        self.data = torch.randn(self.global_batch, 8, config["length"])
        self.labels = torch.randint(0, 10, (self.global_batch,))
        self.cost = 0.0  # per-sample seconds of the base device
        self.steps_done = 0

    def gradients(self, b: int, watch: Stopwatch | None) -> float:
        """Mean loss and gradient of the first `b` samples in chunks (gradient accumulation), paced
        chunk by chunk to the simulated speed so a worker computes at its pace all through a step."""
        total = 0.0
        for start in range(0, b, self.chunk):
            end = min(start + self.chunk, b)
            out = self.model(self.data[start:end])
            loss = functional.cross_entropy(out, self.labels[start:end], reduction="sum") / b
            loss.backward()
            total += float(loss.detach())
            if watch is not None:
                self.simulator.pace(watch, end * self.cost)
        return total

    def in_turns(self, work: Callable[[], Any]) -> Any:
        """`work` on each rank alone, one after the other; each rank gets its own result."""
        mine = None
        for turn in range(self.world):
            dist.barrier()
            if self.rank == turn:
                mine = work()
        dist.barrier()
        return mine

    def calibrate(self) -> dict[str, float]:
        b = self.global_batch // self.world

        def measure() -> float:
            def once() -> None:
                for p in self.params:
                    p.grad = None
                self.gradients(b, None)

            return per_sample_seconds(once, b, repeats=self.config["calibration_repeats"])

        own = self.in_turns(measure)
        self.cost = common_costs({"step": own}, torch.device("cpu"))["step"]
        return {"own_us_per_sample": own * 1e6, "base_us_per_sample": self.cost * 1e6}

    def compute(self, b: int) -> tuple[float, float, float]:
        """One step's compute at the simulated speed: (loss, seconds, CPU seconds)."""
        watch = self.simulator.begin()
        cpu = time.thread_time()
        for p in self.params:
            p.grad = None
        loss = self.gradients(b, watch)
        cpu = time.thread_time() - cpu
        return loss, self.simulator.finish(watch, b * self.cost), cpu

    def solo(self) -> dict[str, float]:
        b = self.global_batch // self.world

        def alone() -> dict[str, float]:
            times = [self.compute(b)[1] for _ in range(self.config["solo_steps"])]
            return {"local_batch": b, "compute_s": float(np.mean(times))}

        return dict(self.in_turns(alone))

    def run_phase(self, name: str, split: list[int], steps: int, planned: int) -> dict[str, Any]:
        """`steps` synchronous steps; this rank's means (seconds) and the phase's wall time."""
        computes, syncs, comms, step_times, cpus = [], [], [], [], []
        b = split[self.rank]
        overrun, target = self.simulator.overrun_seconds, self.simulator.target_seconds
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            local_loss, compute, cpu = self.compute(b)
            sync = time.perf_counter()
            synchronize_gradients(
                self.params, b, self.global_batch, local_loss, self.rank, self.world, reducer=self.reducer
            )
            comm = time.perf_counter() - sync
            self.optimizer.step()
            computes.append(compute)
            cpus.append(cpu)
            syncs.append(sync - step_start)
            comms.append(comm)
            step_times.append(time.perf_counter() - step_start)
            self.steps_done += 1
            self.report_progress(name, split, planned)
        target = self.simulator.target_seconds - target
        return {
            **step_means(computes, syncs, comms, step_times, time.perf_counter() - started),
            "cpu_per_sample": float(np.sum(cpus)) / max(b * steps, 1),
            "overrun_share": (self.simulator.overrun_seconds - overrun) / target if target > 0 else 0.0,
        }

    def run_alone(self, steps: int, planned: int) -> dict[str, Any] | None:
        """Rank 0 trains `steps` steps of the whole global batch alone while the others wait; its
        means (None on the others)."""
        dist.barrier()
        means = None
        if self.rank == 0:
            computes, step_times = [], []
            started = time.perf_counter()
            for _ in range(steps):
                step_start = time.perf_counter()
                _loss, compute, _cpu = self.compute(self.global_batch)
                self.optimizer.step()
                computes.append(compute)
                step_times.append(time.perf_counter() - step_start)
                self.steps_done += 1
                self.report_progress("alone", [self.global_batch] + [0] * (self.world - 1), planned)
            means = {"compute": float(np.mean(computes)), "wall": time.perf_counter() - started}
        dist.barrier()
        return means

    def report_progress(self, phase: str, split: list[int], planned: int) -> None:
        if self.rank == 0:
            line = {"phase": phase, "split": split, "done": self.steps_done, "total": planned}
            with Path(self.config["progress"]).open("a") as out:
                out.write(json.dumps(line) + "\n")

    def gather(self, value: Any) -> list[Any]:
        return gather(value, self.world)


def phase_report(
    split: list[int], steps: int, global_batch: int, means: list[dict[str, Any]]
) -> dict[str, Any]:
    """A phase as the artifact records it (per worker, in rank order)."""
    slowest_per_step = np.max(np.array([m["computes"] for m in means]), axis=0)
    return {
        "local_batches": split,
        "steps": steps,
        "samples_per_s": global_batch * steps / max(m["wall"] for m in means),
        "worker_compute_ms": [m["compute"] * 1e3 for m in means],
        "worker_comm_ms": [m["comm"] * 1e3 for m in means],
        "worker_step_ms": [m["step"] * 1e3 for m in means],
        "slowest_compute_per_step_ms": float(np.mean(slowest_per_step)) * 1e3,
        "worker_cpu_us_per_sample": [m["cpu_per_sample"] * 1e6 for m in means],
        "worker_overrun_share": [m["overrun_share"] for m in means],
    }


def alone_report(global_batch: int, world: int, steps: int, means: dict[str, Any]) -> dict[str, Any]:
    """The fastest worker alone, in the shape of a phase: the whole batch on rank 0, none elsewhere."""
    return {
        "local_batches": [global_batch] + [0] * (world - 1),
        "steps": steps,
        "samples_per_s": global_batch * steps / means["wall"],
        "worker_compute_ms": [means["compute"] * 1e3] + [0.0] * (world - 1),
    }


def prior_split(global_batch: int, priors: list[float]) -> list[int]:
    """The split the operator starts a job on by its GPUs' class priors (controller/plans.py)."""
    inf = float("inf")
    return [int(b) for b in proportional_split(global_batch, priors, [1] * len(priors), [inf] * len(priors))]


def measurements(version: int, steps: int, means: list[dict[str, Any]]) -> JobMeasurements:
    workers = tuple(
        WorkerMeasurement(r, steps, m["compute"], m["sync_start"], m["comm"], m["step"])
        for r, m in enumerate(means)
    )
    return JobMeasurements(plan_version=version, epoch=version, workers=workers)


def rebalance_step(
    plan: Plan,
    measured: JobMeasurements,
    previous: tuple[Plan, JobMeasurements] | None,
    history: dict[int, list[Any]],
    policy: BatchPolicy,
    last_round: bool,
) -> list[Any]:
    """What the operator's rebalancer does after an epoch: confirm the last rebalance by measurement,
    else decide a new split. Returns [next plan JSON or None, reason, whether the rounds end]."""
    history.update(record(history, measured, plan))
    if previous is not None:
        verdict = confirm(plan, measured, *previous, policy.min_improvement, plan.version)
        if verdict is not None:  # settled: stay, or go back to the faster previous split
            return [verdict.plan.model_dump_json() if verdict.plan else None, verdict.reason, True]
    decision = decide(plan, history, policy, measured, plan.version)
    if decision.plan is None:
        return [None, decision.reason, True]
    if last_round:
        return [None, f"round limit reached (next would be: {decision.reason})", True]
    return [decision.plan.model_dump_json(), decision.reason, False]


PhaseRunner = Callable[[str, list[int], int], list[dict[str, Any]]]
"""Runs a phase of the split for the steps on every rank: every rank's means, in rank order."""


def rounds(
    rank: int,
    config: dict[str, Any],
    run: PhaseRunner,
    start: tuple[list[int], int, list[dict[str, Any]]],
) -> tuple[Plan, list[Any], str]:
    """Rebalancing rounds from a measured first split (its split, steps and every rank's means) to a
    settled split, decided on rank 0 by the operator's own functions."""
    split, start_steps, means = start
    world, b_total = len(split), sum(split)
    policy = BatchPolicy(
        base_global_batch=b_total,
        minimum=b_total,
        maximum=b_total,
        adaptive=False,
        min_improvement=config["min_improvement"],
        per_worker_max=(None,) * world,
    )
    plan = Plan(version=1, world_size=world, global_batch=b_total, local_batches=split)
    measured = measurements(plan.version, start_steps, means)
    history: dict[int, list[Any]] = {}
    previous: tuple[Plan, JobMeasurements] | None = None
    reports: list[dict[str, Any]] = []
    while True:
        shared: list[Any] = [None, "", True]
        if rank == 0:
            last = len(reports) == config["max_rounds"]
            shared = rebalance_step(plan, measured, previous, history, policy, last)
        dist.broadcast_object_list(shared, 0)
        next_json, reason, final = shared
        if final:
            return (Plan.model_validate_json(next_json) if next_json else plan), reports, reason
        previous = (plan, measured)
        plan = Plan.model_validate_json(next_json)
        split = list(plan.local_batches)
        steps = config["round_steps"]
        means = run(f"round {len(reports) + 1}", split, steps)
        measured = measurements(plan.version, steps, means)
        reports.append({**phase_report(split, steps, b_total, means), "decision": reason})


def worker_main(config: dict[str, Any]) -> None:
    worker = Worker(config)
    world, b_total, steps = worker.world, worker.global_batch, config["steps"]
    calibration = worker.gather(worker.calibrate())
    solo = worker.gather(worker.solo())
    even = [b_total // world + (1 if r < b_total % world else 0) for r in range(world)]
    planned = 5 * steps + config["max_rounds"] * config["round_steps"]
    worker.run_phase("warm-up", even, 2, planned)  # first-call allocations are not measured
    worker.steps_done = 0
    even_means = worker.gather(worker.run_phase("even", even, steps, planned))
    final_plan, round_reports, reason = rounds(
        worker.rank,
        config,
        lambda name, split, steps: worker.gather(worker.run_phase(name, split, steps, planned)),
        (even, steps, even_means),
    )
    split = list(final_plan.local_batches)
    data_means = worker.gather(worker.run_phase("data", split, steps, planned))
    by_priors = prior_split(b_total, config["prior_ratios"])
    prior_means = worker.gather(worker.run_phase("prior", by_priors, steps, planned))
    again_means = worker.gather(worker.run_phase("even-again", even, steps, planned))
    alone_means = worker.run_alone(steps, planned)
    if worker.rank == 0:
        result = {
            "calibration": calibration,
            "solo": solo,
            "even": phase_report(even, steps, b_total, even_means),
            "rounds": round_reports,
            "settled": reason,
            "data": phase_report(split, steps, b_total, data_means),
            "prior": phase_report(by_priors, steps, b_total, prior_means),
            "even_again": phase_report(even, steps, b_total, again_means),
            "fastest_alone": alone_report(b_total, world, steps, alone_means),
        }
        Path(config["out"]).write_text(json.dumps(result, indent=2))
    # Everyone leaves together: a rank tearing its connections down while another still uses them
    # makes gloo abort that process.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    worker_entry(worker_main)
