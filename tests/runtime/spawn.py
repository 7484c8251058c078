"""Run a script as WORLD ranks on loopback (gloo), with a deadline and no process left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hetero_operator.warm_start import spawn
from hetero_runtime.local import free_port

SCRIPTS = Path(__file__).parent / "scripts"


def start_ranks(
    script: str,
    world: int,
    out_dir: Path,
    timeout: float = 90.0,
    extra_env: dict[str, str] | None = None,
    rank_env: Callable[[int], dict[str, str]] | None = None,
    args: list[str] | None = None,
) -> list[tuple[int, str]]:
    """Run `world` copies of scripts/`script` (or of `script` itself, given as an absolute path) with
    `args` to their end; every rank's (exit code, output). `rank_env(rank)`: variables for one rank
    only (a volume only rank 0 mounts, say)."""
    port = free_port()
    processes = []
    try:
        for rank in range(world):
            env = dict(os.environ)
            env.update(
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": str(world),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "OUT_DIR": str(out_dir),
                    "OMP_NUM_THREADS": "1",
                    **(extra_env or {}),
                    **(rank_env(rank) if rank_env is not None else {}),
                }
            )
            processes.append(
                spawn(
                    [sys.executable, str(SCRIPTS / script), *(args or [])],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [(p.returncode, output) for p, output in zip(processes, outputs, strict=True)]


def run_ranks(script: str, world: int, out_dir: Path, *args: Any, **options: Any) -> list[dict[str, Any]]:
    """`start_ranks` (the same arguments), each rank succeeding and writing out_dir/rank-N.json.
    Returns those."""
    ended = start_ranks(script, world, out_dir, *args, **options)
    for rank, (code, output) in enumerate(ended):
        assert code == 0, f"rank {rank} failed ({code}):\n{output}"
    return [json.loads((out_dir / f"rank-{rank}.json").read_text()) for rank in range(world)]
