"""What the runtime benchmarks share: worker processes on loopback, their rendezvous, and artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def run_workers(script: Path, envs: list[dict[str, str]], out: Path, timeout: float) -> dict[str, Any]:
    """Start one `script` process per environment (rank order), wait for all, read rank 0's `out`."""
    from hetero_runtime.local import free_port

    port = str(free_port())
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for rank, extra in enumerate(envs):
            env = {
                **os.environ,
                "RANK": str(rank),
                "WORLD_SIZE": str(len(envs)),
                "MASTER_PORT": port,
                **extra,
            }
            processes.append(subprocess.Popen([sys.executable, str(script)], env=env))
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
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def join_gloo(rank: int, world: int, timeout_seconds: float) -> None:
    """Join the benchmark's process group on loopback (gloo: it reaches CPU and GPU workers alike)."""
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_seconds),
    )


def seeded_model(model: Callable[[], torch.nn.Module], device: torch.device) -> torch.nn.Module:
    """The same initial model on every rank (rank 0's), on `device`."""
    torch.manual_seed(0)
    built = model().to(device)
    for p in built.parameters():
        dist.broadcast(p.data, 0)
    return built


def step_means(
    computes: list[float], syncs: list[float], comms: list[float], steps: list[float], wall: float
) -> dict[str, Any]:
    """A phase's per-step means on one rank (seconds), its wall time and every step's compute."""
    return {
        "compute": sum(computes) / len(computes),
        "sync_start": sum(syncs) / len(syncs),
        "comm": sum(comms) / len(comms),
        "step": sum(steps) / len(steps),
        "wall": wall,
        "computes": computes,
    }


def gather(value: Any, world: int) -> list[Any]:
    """Every rank's `value`, in rank order (all ranks call it)."""
    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


def worker_entry(main: Callable[[dict[str, Any]], None]) -> None:
    """A worker script's __main__: run with the benchmark's configuration, then leave at once. Every
    rank has passed the last barrier and left the process group by then; torch's C++ teardown at
    interpreter exit has aborted a rank now and then after the work was done."""
    main(json.loads(os.environ["BENCH_CONFIG"]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def write_artifact(result: dict[str, Any], out: Path, headline: tuple[str, ...]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({key: result[key] for key in headline}))
    print(f"artifact: {out}", file=sys.stderr)
