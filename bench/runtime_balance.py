"""Runtime balance: even-split synchronous data parallelism versus the `data` strategy's planned split.

One run, three loopback workers at simulated speeds 1, 0.5, 0.25, the same model and the same
synchronous step (uneven-batch weighted all-reduce). Phases, in order:
  1. even split (what plain DDP does), measured;
  2. the planner's warm-up split from phase 1 (inverse per-sample time);
  3. four rebalancing rounds: the planner's `next_split` on the last two phases' measurements
     (OptPerf once two batch sizes were seen; what the operator's rebalancer does once per epoch);
  4. the final OptPerf split, measured.
Reported: samples/s of phases 1 and 4, `speedup_vs_even`, and `efficiency` = phase-4 samples/s
divided by the sum of the workers' own samples/s (samples / own compute time) in phase 4.

    python bench/runtime_balance.py [--quick] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

SPEEDS = [1.0, 0.5, 0.25]


def worker_main(config: dict[str, Any]) -> None:
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn import functional

    from hetero_operator.planner.fitting import PerfSample, WorkerSpec, next_split
    from hetero_runtime.simulate import SpeedSimulator
    from hetero_runtime.strategies.data import synchronize_gradients

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
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
    global_batch = config["global_batch"]
    data = torch.randn(global_batch, 8, length)
    labels = torch.randint(0, 10, (global_batch,))

    def run_phase(local_batches: list[int], steps: int) -> tuple[list[PerfSample], float, list[float]]:
        samples: list[PerfSample] = []
        computes: list[float] = []
        dist.barrier()
        started = time.perf_counter()
        for _ in range(steps):
            watch = simulator.begin()
            b = local_batches[rank]
            for p in params:
                p.grad = None
            loss = functional.cross_entropy(model(data[:b]), labels[:b])
            loss.backward()
            compute = simulator.finish(watch)
            sync = time.perf_counter()
            synchronize_gradients(params, b, global_batch, float(loss.detach()), rank, world)
            comm = time.perf_counter() - sync
            optimizer.step()
            samples.append(PerfSample(b, compute * 1e3, compute * 1e3, comm * 1e3))
            computes.append(compute)
        wall = time.perf_counter() - started
        return samples, wall, computes

    def gather(value: Any) -> list[Any]:
        out: list[Any] = [None] * world
        dist.all_gather_object(out, value)
        return out

    specs = [WorkerSpec(f"rank{r}") for r in range(world)]
    # The rebalancer sees the last two phases only: speeds on a shared host drift, old samples mislead.
    recent: list[list[list[PerfSample]]] = []
    run_phase([global_batch // world] * world, 2)  # warm-up: first-call allocations are not measured
    report: dict[str, Any] = {}
    split = [global_batch // world + (1 if r < global_batch % world else 0) for r in range(world)]
    phases = [("even", config["steps"]), ("warmup", config["warmup_steps"])]
    phases += [(f"rebalance{i}", config["warmup_steps"]) for i in range(config["rebalances"])]
    phases += [("data", config["steps"])]
    for phase, steps in phases:
        samples, wall, computes = run_phase(split, steps)
        recent = [*recent[-1:], gather(samples)]
        walls = gather(wall)
        medians = gather(float(np.mean(computes)))
        comms = gather(float(np.median([x.comm_ms for x in samples])))
        solo = [split[r] / medians[r] for r in range(world)]
        report[phase] = {
            "local_batches": split,
            "samples_per_s": global_batch * steps / max(walls),
            "worker_compute_ms": [m * 1e3 for m in medians],
            "worker_comm_ms": comms,
            "worker_solo_samples_per_s": solo,
        }
        history = {
            spec.name: [x for phase_samples in recent for x in phase_samples[r]]
            for r, spec in enumerate(specs)
        }
        decision = next_split(global_batch, specs, history)
        report[phase]["next_planner_stage"] = decision.stage.value
        split = list(decision.local_batches)
    if rank == 0:
        even, data_phase = report["even"], report["data"]
        result = {
            "workers": world,
            "speeds": [s * config["base_speed"] for s in SPEEDS],
            "global_batch": global_batch,
            "steps_per_phase": config["steps"],
            "even": even,
            "planner_stages": {name: report[name]["next_planner_stage"] for name, _ in phases},
            "data": data_phase,
            "speedup_vs_even": data_phase["samples_per_s"] / even["samples_per_s"],
            "efficiency": data_phase["samples_per_s"] / sum(data_phase["worker_solo_samples_per_s"]),
            "even_efficiency": even["samples_per_s"] / sum(even["worker_solo_samples_per_s"]),
        }
        Path(config["out"]).write_text(json.dumps(result, indent=2))
    dist.destroy_process_group()


def supervise(config: dict[str, Any], timeout: float) -> dict[str, Any]:
    from hetero_runtime.local import free_port

    port = free_port()
    processes = []
    try:
        for rank, speed in enumerate(SPEEDS):
            env = dict(os.environ)
            env.update(
                RANK=str(rank),
                WORLD_SIZE=str(len(SPEEDS)),
                MASTER_PORT=str(port),
                HETEROTRAIN_SIMULATED_SPEED=repr(speed * config["base_speed"]),
                OMP_NUM_THREADS="1",
                BENCH_CONFIG=json.dumps(config),
            )
            processes.append(subprocess.Popen([sys.executable, __file__, "--worker"], env=env))
        deadline = time.monotonic() + timeout
        for p in processes:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in processes]
    if any(codes):
        raise SystemExit(f"benchmark worker failed: exit codes {codes}")
    result: dict[str, Any] = json.loads(Path(config["out"]).read_text())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about 30 s in all)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json-out", type=Path, help="also write the JSON result here")
    parser.add_argument(
        "--base-speed",
        type=float,
        default=1.0,
        help="multiply every simulated speed (0.25 keeps the 1:2:4 mix but leaves a shared host idle CPU)",
    )
    args = parser.parse_args()
    if args.worker:
        worker_main(json.loads(os.environ["BENCH_CONFIG"]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        config = {
            "global_batch": 256,
            "length": 64,
            "steps": 12 if args.quick else 40,
            "warmup_steps": 6 if args.quick else 12,
            "rebalances": 4,
            "base_speed": args.base_speed,
            "out": str(Path(tmp) / "result.json"),
        }
        result = supervise(config, timeout=300)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text)


if __name__ == "__main__":
    main()
