"""Runtime balance: even-split synchronous data parallelism versus the `data` strategy's planned split.

One run, three loopback gloo workers whose simulated speeds keep the ratios 1 : 0.5 : 0.25, the same
model and the same synchronous step (uneven-batch weighted all-reduce) on both sides. Phases:
  1. even split (what plain DDP does), measured;
  2. rebalancing rounds, one per "epoch", decided exactly as the operator's rebalancer decides between
     epochs (``hetero_operator.rebalance.decide``): the planner's warm-up split (inverse per-sample
     time), then OptPerf on the fitted linear models, each new split confirmed by its measured
     balance (a worse one is undone, a gain under half the threshold ends the rounds);
  3. the split the rounds settled on, measured.
Reported: samples/s of phases 1 and 3, `speedup_vs_even`, and `efficiency` = phase-3 samples/s divided
by the sum of the workers' own samples/s (local batch / own mean compute time) in phase 3. Per worker
and phase the JSON also holds the host's state: CPU time per sample, and the wall time per step the
simulator could not absorb by sleeping (`worker_overrun_ms`, 0 when the host had CPU to spare).

By default every speed is multiplied by 0.25 (time dilation 4, as the test bed's local process nodes
do), so three simulated GPUs fit on a 2-core host without slowing each other: `--base-speed 1` runs
the undilated speeds 1, 0.5, 0.25. The workers are pinned to as few cores as their simulated load fits
in (one, dilated), and each stretches its compute chunk by chunk, so it works at its simulated pace
all through a step, as a GPU does.

    python bench/runtime_balance.py [--quick] [--base-speed F] [--global-batch N] [--json-out FILE] [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

SPEED_RATIOS = (1.0, 0.5, 0.25)


# The simulated load (sum of speeds: the share of its time each worker computes) one core takes
# before the next core is used. At half load the time a worker waits for its core is absorbed by its
# own stretching sleeps; any that is not shows as `worker_overrun_ms`.
SHARED_CORE_LOAD = 0.5


def core_of_each_worker(speeds: list[float], cores: list[int]) -> list[int]:
    """A core for each simulated GPU: as few cores as the load fits in at SHARED_CORE_LOAD each, so
    the host's slow spells and drift on a core are common to the workers on it (they cancel in the
    split's balance, and a step's slowest worker is barely slower than its mean). Workers that fit
    nowhere go, fastest first, to the least loaded core."""
    load = dict.fromkeys(cores, 0.0)
    out = [cores[0]] * len(speeds)
    for rank in sorted(range(len(speeds)), key=lambda r: -speeds[r]):
        fits = [c for c in cores if load[c] + speeds[rank] <= SHARED_CORE_LOAD]
        core = fits[0] if fits else min(cores, key=lambda c: (load[c], cores.index(c)))
        out[rank] = core
        load[core] += speeds[rank]
    return out


def worker_main(config: dict[str, Any]) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn import functional

    from hetero_operator.plan import Plan
    from hetero_operator.rebalance.decide import BatchPolicy, confirm, decide
    from hetero_operator.rebalance.history import record
    from hetero_operator.rebalance.measurements import JobMeasurements, WorkerMeasurement
    from hetero_runtime.simulate import SpeedSimulator, Stopwatch
    from hetero_runtime.strategies.data import synchronize_gradients

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # A worker the scheduler moves between cores comes back to cold caches and its compute time
    # jumps: each keeps to the core it was given.
    core = config["worker_cores"][rank]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=120),
    )
    simulator = SpeedSimulator(float(os.environ["HETEROTRAIN_SIMULATED_SPEED"]))
    torch.manual_seed(0)
    # A 1-D convolutional net: much compute per parameter, so the step is compute-bound as on GPUs.
    channels, length = 32, config["length"]
    model = nn.Sequential(
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
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    params = list(model.parameters())
    global_batch, chunk = config["global_batch"], config["micro_batch"]
    data = torch.randn(global_batch, 8, length)
    labels = torch.randint(0, 10, (global_batch,))
    progress = Path(config["progress"])
    steps_done = 0

    def report_progress(phase: str, split: list[int], planned_total: int) -> None:
        if rank == 0:
            line = {"phase": phase, "split": split, "done": steps_done, "total": planned_total}
            with progress.open("a") as out:
                out.write(json.dumps(line) + "\n")

    def compute_gradients(b: int, watch: Stopwatch) -> float:
        """Mean loss and gradient of the first `b` samples, in chunks (gradient accumulation): a
        chunk's activations stay in the CPU cache, so a step's time is proportional to `b` and
        steady on a shared host, as a GPU's is. Each chunk is stretched to the simulated speed as it
        ends, so the workers' CPU use spreads over the step instead of colliding at its start."""
        total = 0.0
        for start in range(0, b, chunk):
            end = min(start + chunk, b)
            loss = functional.cross_entropy(model(data[start:end]), labels[start:end], reduction="sum") / b
            loss.backward()
            total += float(loss.detach())
            simulator.pace(watch)
        return total

    def run_phase(name: str, split: list[int], steps: int, planned_total: int) -> dict[str, Any]:
        """Run `steps` synchronous steps; this rank's means (seconds) and the phase's wall time."""
        nonlocal steps_done
        computes, syncs, comms, step_times, cpus = [], [], [], [], []
        b = split[rank]
        overrun_before = simulator.overrun_seconds
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            step_start = time.perf_counter()
            watch = simulator.begin()
            for p in params:
                p.grad = None
            local_loss = compute_gradients(b, watch)
            cpus.append(time.thread_time() - watch.cpu)
            compute = simulator.finish(watch)
            sync = time.perf_counter()
            synchronize_gradients(params, b, global_batch, local_loss, rank, world)
            comm = time.perf_counter() - sync
            optimizer.step()
            computes.append(compute)
            syncs.append(sync - step_start)
            comms.append(comm)
            step_times.append(time.perf_counter() - step_start)
            steps_done += 1
            report_progress(name, split, planned_total)
        wall = time.perf_counter() - started
        return {
            "compute": float(np.mean(computes)),
            "sync_start": float(np.mean(syncs)),
            "comm": float(np.mean(comms)),
            "step": float(np.mean(step_times)),
            "wall": wall,
            "cpu_per_sample": float(np.sum(cpus)) / (b * steps),
            "overrun": (simulator.overrun_seconds - overrun_before) / steps,
            "computes": computes,
        }

    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * world
        dist.all_gather_object(out, value)
        return out

    def phase_report(split: list[int], steps: int, means: list[dict[str, Any]]) -> dict[str, Any]:
        # Where a synchronous step's time goes beyond the workers' mean compute: the slowest mean
        # (split imbalance), the slowest worker of each step (step-to-step jitter), and the rest
        # (all-reduce, optimizer, waking up).
        slowest_per_step = np.max(np.array([m["computes"] for m in means]), axis=0)
        return {
            "local_batches": split,
            "samples_per_s": global_batch * steps / max(m["wall"] for m in means),
            "worker_compute_ms": [m["compute"] * 1e3 for m in means],
            "worker_comm_ms": [m["comm"] * 1e3 for m in means],
            "worker_step_ms": [m["step"] * 1e3 for m in means],
            "worker_solo_samples_per_s": [split[r] / means[r]["compute"] for r in range(world)],
            "slowest_compute_per_step_ms": float(np.mean(slowest_per_step)) * 1e3,
            # Diagnostics of the host: CPU time per sample (drifts when the host is contended) and
            # the wall time per step the simulator could not absorb (0 = speeds met exactly).
            "worker_cpu_us_per_sample": [m["cpu_per_sample"] * 1e6 for m in means],
            "worker_overrun_ms": [m["overrun"] * 1e3 for m in means],
        }

    def measurements(version: int, steps: int, means: list[dict[str, Any]]) -> JobMeasurements:
        workers = tuple(
            WorkerMeasurement(r, steps, m["compute"], m["sync_start"], m["comm"], m["step"])
            for r, m in enumerate(means)
        )
        return JobMeasurements(plan_version=version, epoch=version, workers=workers)

    # The job spec's rebalance policy: fixed total batch, the bench's improvement threshold.
    policy = BatchPolicy(
        base_global_batch=global_batch,
        minimum=global_batch,
        maximum=global_batch,
        adaptive=False,
        min_improvement=config["min_improvement"],
        per_worker_max=(None,) * world,
    )

    def rebalance_step(
        plan: Plan,
        measured: JobMeasurements,
        previous: tuple[Plan, JobMeasurements] | None,
        history: dict[int, list[Any]],
        last_round: bool,
    ) -> list[Any]:
        """What the operator's rebalancer does after an epoch: confirm the last rebalance by
        measurement, else decide a new split. Returns [next plan JSON or None, reason, final]."""
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

    even = [global_batch // world + (1 if r < global_batch % world else 0) for r in range(world)]
    steps, round_steps, max_rounds = config["steps"], config["round_steps"], config["max_rounds"]
    planned = steps + max_rounds * round_steps + steps
    run_phase("warm-up", even, 2, planned)  # first-call allocations are not measured
    steps_done = 0

    plan = Plan(version=1, world_size=world, global_batch=global_batch, local_batches=even)
    means = gather(run_phase("even", even, steps, planned))
    even_report = phase_report(even, steps, means)
    measured = measurements(plan.version, steps, means)
    history: dict[int, list[Any]] = {}
    previous: tuple[Plan, JobMeasurements] | None = None
    rounds: list[dict[str, Any]] = []
    last_report = even_report
    while True:
        shared: list[Any] = [None, "", True]  # next plan (JSON), reason, whether the rounds end
        if rank == 0:
            shared = rebalance_step(plan, measured, previous, history, len(rounds) == max_rounds)
        dist.broadcast_object_list(shared, 0)
        next_json, last_report["decision"], final = shared
        if final:
            final_plan = Plan.model_validate_json(next_json) if next_json else plan
            break
        previous = (plan, measured)
        plan = Plan.model_validate_json(next_json)
        split = list(plan.local_batches)
        means = gather(run_phase(f"round {len(rounds) + 1}", split, round_steps, planned))
        measured = measurements(plan.version, round_steps, means)
        last_report = phase_report(split, round_steps, means)
        rounds.append(last_report)
    planned = steps_done + steps
    final_split = list(final_plan.local_batches)
    means = gather(run_phase("data", final_split, steps, planned))
    data_report = phase_report(final_split, steps, means)
    if rank == 0:
        result = {
            "workers": world,
            "global_batch": global_batch,
            "micro_batch": chunk,
            "steps_per_phase": steps,
            "steps_per_round": round_steps,
            "min_improvement": config["min_improvement"],
            "worker_cores": config["worker_cores"],
            "even": even_report,
            "rounds": rounds,
            "data": data_report,
            "speedup_vs_even": data_report["samples_per_s"] / even_report["samples_per_s"],
            "efficiency": data_report["samples_per_s"] / sum(data_report["worker_solo_samples_per_s"]),
            "even_efficiency": even_report["samples_per_s"] / sum(even_report["worker_solo_samples_per_s"]),
        }
        Path(config["out"]).write_text(json.dumps(result, indent=2))
    # Everyone leaves together: a rank tearing its connections down while another still uses them
    # makes gloo abort that process.
    dist.barrier()
    dist.destroy_process_group()


def follow_progress(path: Path, done: threading.Event) -> None:
    """Show rank 0's progress lines as a rich progress bar on stderr until `done` is set."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("starting workers", total=None)
        offset = 0
        while not done.wait(0.2):
            if not path.exists():
                continue
            with path.open() as lines:
                lines.seek(offset)
                chunk = lines.read()
            complete = chunk[: chunk.rfind("\n") + 1]
            offset += len(complete)
            for line in complete.splitlines()[-1:]:
                state = json.loads(line)
                split = "/".join(str(b) for b in state["split"])
                bar.update(
                    task,
                    description=f"{state['phase']} [{split}]",
                    completed=state["done"],
                    total=state["total"],
                )


def supervise(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    from hetero_runtime.local import free_port

    port = free_port()
    processes = []
    done = threading.Event()
    follower = threading.Thread(target=follow_progress, args=(Path(config["progress"]), done), daemon=True)
    follower.start()
    try:
        for rank, ratio in enumerate(SPEED_RATIOS):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(len(SPEED_RATIOS)),
                MASTER_PORT=str(port),
                HETEROTRAIN_SIMULATED_SPEED=repr(ratio * config["base_speed"]),
                OMP_NUM_THREADS="1",
                BENCH_CONFIG=json.dumps(config),
            )
            processes.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
        deadline = time.monotonic() + timeout
        for p in processes:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        done.set()
        follower.join()
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in processes]
    if any(codes):
        raise SystemExit(f"benchmark worker failed: exit codes {codes}")
    result: dict[str, Any] = json.loads(Path(config["out"]).read_text())
    return result


# More than this share of a measured step lost to host contention (overrun) makes a run unreliable.
CONTENDED_SHARE = 0.02


def contention_share(result: dict[str, Any]) -> float:
    """The largest share of a measured phase's step that a worker lost to a busy host."""
    phases = (result["even"], result["data"])
    return max(max(p["worker_overrun_ms"]) / max(p["worker_step_ms"]) for p in phases)


def mode_label(time_dilation: float) -> str:
    return f"dilated x{time_dilation:g}" if time_dilation != 1 else "undilated"


def table_row(result: dict[str, Any]) -> str:
    """One row of BENCHMARKS.md's runtime table for a result."""
    even, data = result["even"], result["data"]
    cells = [
        mode_label(result["time_dilation"]),
        ", ".join(f"{s:g}" for s in result["simulated_speeds"]),
        f"{even['samples_per_s']:.0f}",
        f"{data['samples_per_s']:.0f}",
        f"{result['speedup_vs_even']:.2f}",
        f"{result['efficiency']:.3f}",
        f"{result['even_efficiency']:.3f}",
        " / ".join(str(b) for b in data["local_batches"]),
        " / ".join(f"{t:.0f}" for t in data["worker_compute_ms"]),
        f"{data['slowest_compute_per_step_ms']:.0f}",
        f"{max(data['worker_step_ms']):.0f}",
        f"{len(result['rounds'])}",
        " / ".join(f"{t:.0f}" for t in data["worker_overrun_ms"]),
        " → ".join(f"{x:.1f}" for x in result["host_load_1min"]),
    ]
    return "| " + " | ".join(cells) + " |"


def with_row(markdown: str, row: str) -> str:
    """`markdown` with the runtime table's row for the same mode replaced (or added after the last)."""
    label = row.split("|")[1].strip()
    section = markdown.index("\n## Runtime\n")
    lines = markdown[section:].split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if first is None:
        raise SystemExit("BENCHMARKS.md: the Runtime section has no table to update")
    end = first
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    same = [i for i in range(first + 2, end) if lines[i].split("|")[1].strip() == label]
    if same:
        lines[same[0]] = row
    else:
        lines.insert(end, row)
    return markdown[:section] + "\n".join(lines)


def main() -> None:
    from hetero_operator.testbed.cluster import LOCAL_SPEED_SCALE

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about a third of a full run)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help="also write the JSON result here")
    parser.add_argument(
        "--write", action="store_true", help="update this mode's row of the table in BENCHMARKS.md"
    )
    parser.add_argument(
        "--base-speed",
        type=float,
        default=LOCAL_SPEED_SCALE,
        help=f"multiply every simulated speed by this (default {LOCAL_SPEED_SCALE}: time dilation "
        f"{1 / LOCAL_SPEED_SCALE:g}, as the test bed runs; 1 = undilated)",
    )
    parser.add_argument("--global-batch", type=int, default=1024, help="samples per synchronous step")
    parser.add_argument(
        "--min-improvement",
        type=float,
        default=0.01,
        help="the job's rebalance.minImprovement: smallest predicted gain worth a new split",
    )
    args = parser.parse_args()
    if args.worker:
        worker_main(json.loads(os.environ["BENCH_CONFIG"]))
        # Every rank has passed the last barrier and left the process group; torch's C++ teardown at
        # interpreter exit has aborted a rank now and then ("terminate called without an active
        # exception") after the work was done, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    if not 0 < args.base_speed <= 1:
        parser.error(f"--base-speed: must be in (0, 1], got {args.base_speed}")
    if args.global_batch < len(SPEED_RATIOS):
        parser.error(f"--global-batch: needs at least one sample per worker ({len(SPEED_RATIOS)})")
    started, load_before = time.monotonic(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "global_batch": args.global_batch,
            "micro_batch": 16,
            "length": 64,
            "steps": 10 if args.quick else 40,
            "round_steps": 6 if args.quick else 16,
            "max_rounds": 4 if args.quick else 6,
            "min_improvement": args.min_improvement,
            "base_speed": args.base_speed,
            "worker_cores": core_of_each_worker(
                [r * args.base_speed for r in SPEED_RATIOS], sorted(os.sched_getaffinity(0))
            ),
            "out": str(Path(tmp) / "result.json"),
            "progress": str(Path(tmp) / "progress.jsonl"),
        }
        result = supervise(config, timeout=600)
    result = {
        "speed_ratios": list(SPEED_RATIOS),
        "time_dilation": 1 / args.base_speed,
        "simulated_speeds": [r * args.base_speed for r in SPEED_RATIOS],
        **result,
        "seconds": time.monotonic() - started,
        "host_load_1min": [load_before, os.getloadavg()[0]],
        "cpus": os.cpu_count(),
    }
    result["host_contention_share"] = contention_share(result)
    if result["host_contention_share"] > CONTENDED_SHARE:
        print(
            f"warning: a worker lost {result['host_contention_share']:.0%} of a step to other load on "
            "this host (worker_overrun_ms): the simulated speeds were not met; re-run on a quieter host",
            file=sys.stderr,
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text)
    if args.write:
        from benchmarks_md import BENCHMARKS_MD

        BENCHMARKS_MD.write_text(with_row(BENCHMARKS_MD.read_text(), table_row(result)))


if __name__ == "__main__":
    main()
