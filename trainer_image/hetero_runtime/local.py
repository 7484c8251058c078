"""`run-local`: a whole job as processes on loopback, restarted from its checkpoint when a worker dies."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hetero_operator import metric_names as names
from hetero_operator import plan as contract
from hetero_operator.plan import DreamDDPParams, ESyncParams, Plan, SESGDParams, Strategy
from hetero_operator.planner.batch import proportional_split
from hetero_operator.planner.wsp import learning_rate_scale
from hetero_operator.warm_start import spawn
from hetero_runtime.launcher import DEVICE_ENV
from hetero_runtime.progress import parse_progress
from hetero_runtime.torchrun_env import LOCAL_WORLD_SIZE_ENV

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_speeds(text: str, workers: int) -> list[float]:
    """'1,0.5,0.25' -> [1.0, 0.5, 0.25]; one value per worker, each in (0, 1]."""
    try:
        speeds = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--speeds {text!r}: write comma-separated numbers such as 1,0.5,0.25") from None
    if len(speeds) != workers:
        raise ValueError(f"--speeds has {len(speeds)} values for {workers} workers: give one per worker")
    if any(not 0 < s <= 1 for s in speeds):
        raise ValueError(f"--speeds {speeds}: every speed must be in (0, 1] (1 = full speed)")
    return speeds


def sesgd_groups(workers: int) -> int:
    """Largest divisor of `workers` not above √workers (k = √n in the paper)."""
    return max(k for k in range(1, workers + 1) if workers % k == 0 and k * k <= workers)


def example_layer_costs(target: str) -> list[float]:
    """Relative cost of each layer of an example's `layers` option (parameters + 1), for hetpipe cuts."""
    import importlib

    from hetero_runtime.examples import EXAMPLES

    job = importlib.import_module(EXAMPLES.get(target, target)).build_job()
    layers = job.options.get("layers")
    if layers is None:
        raise ValueError(f"{target}: hetpipe needs the job option 'layers' (an nn.Sequential)")
    return [1.0 + sum(p.numel() for p in layer.parameters()) for layer in layers]


def initial_plan(
    strategy: Strategy,
    speeds: Sequence[float],
    global_batch: int,
    version: int = 1,
    layer_costs: Sequence[float] | None = None,
) -> Plan:
    """The plan a local job starts with: local batches proportional to the speed priors."""
    workers = len(speeds)
    batches = list(proportional_split(global_batch, list(speeds), [1] * workers, [float("inf")] * workers))
    extra: dict[str, Any] = {}
    if strategy == Strategy.SESGD:
        extra["sesgd"] = SESGDParams(groups=sesgd_groups(workers), seed=0)
    elif strategy == Strategy.DREAMDDP:
        extra["dreamddp"] = DreamDDPParams(period=3)
    elif strategy == Strategy.ESYNC:
        extra["esync"] = ESyncParams()
        # Every device takes the same batch: speed shows in the number of local steps instead.
        batches = [max(1, global_batch // workers)] * workers
    elif strategy == Strategy.HETPIPE:
        from hetero_runtime.strategies.hetpipe_layout import local_hetpipe_params

        if layer_costs is None:
            raise ValueError("a hetpipe plan needs the model's layer costs to cut it into stages")
        extra["hetpipe"], batches = local_hetpipe_params(speeds, layer_costs, global_batch)
        extra["learning_rate_scale"] = learning_rate_scale(len(extra["hetpipe"].virtual_workers))
    return Plan(
        version=version,
        strategy=strategy,
        world_size=workers,
        global_batch=sum(batches),
        local_batches=batches,
        **extra,
    )


@dataclass
class LocalJobSpec:
    target: str  # example name, module or script
    speeds: list[float]
    work_dir: Path
    plan: Plan
    epochs: int | None = None
    checkpoint_every_epochs: int = 1
    max_restarts: int = 2
    metrics_ports: list[int] | None = None
    seed: int = 0
    extra_env: dict[str, str] = field(default_factory=dict)
    master_addr: str = "127.0.0.1"
    launch_prefixes: list[list[str]] | None = None
    """Per rank, a command prefix (e.g. `ip netns exec NS`) to run the worker in another network."""
    command: list[str] | None = None
    """A training script's command (`python train.py ARGS`) run as `heterotrain worker -- COMMAND`
    runs it, with torchrun's environment; `target` then only names the job."""

    @property
    def workers(self) -> int:
        return len(self.speeds)

    @property
    def plan_file(self) -> Path:
        return self.work_dir / contract.PLAN_CONFIGMAP_KEY

    @property
    def checkpoint_dir(self) -> Path:
        return self.work_dir / "checkpoints"

    def result_file(self, rank: int) -> Path:
        return self.work_dir / "results" / f"rank-{rank}.json"

    def log_file(self, rank: int) -> Path:
        return self.work_dir / "logs" / f"rank-{rank}.log"


def worker_environment(spec: LocalJobSpec, rank: int, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            contract.RANK_ENV: str(rank),
            contract.WORLD_SIZE_ENV: str(spec.workers),
            contract.MASTER_ADDR_ENV: spec.master_addr,
            contract.MASTER_PORT_ENV: str(port),
            contract.PLAN_SOURCE_ENV: str(spec.plan_file),
            contract.CHECKPOINT_DIR_ENV: str(spec.checkpoint_dir),
            contract.CHECKPOINT_EVERY_ENV: str(spec.checkpoint_every_epochs),
            contract.SIMULATED_SPEED_ENV: repr(spec.speeds[rank]),
            contract.SEED_ENV: str(spec.seed),
            contract.RESULT_FILE_ENV: str(spec.result_file(rank)),
            names.JOB_NAME_ENV: spec.work_dir.name,
            names.GPU_CLASS_ENV: f"simulated-{spec.speeds[rank]:g}",
            "OMP_NUM_THREADS": "1",
            # All ranks share this host: rank r takes GPU r when asked to use GPUs. By default they
            # stand in for GPUs on the CPU (several ranks on one GPU cannot use NCCL).
            contract.LOCAL_RANK_ENV: str(rank),
            LOCAL_WORLD_SIZE_ENV: str(spec.workers),
            DEVICE_ENV: os.environ.get(DEVICE_ENV, "cpu"),
        }
    )
    if spec.epochs is not None:
        env[contract.EPOCHS_ENV] = str(spec.epochs)
    if spec.metrics_ports is not None:
        env[names.METRICS_PORT_ENV] = str(spec.metrics_ports[rank])
    env.update(spec.extra_env)
    return env


def worker_command(spec: LocalJobSpec) -> list[str]:
    runtime = [sys.executable, "-m", "hetero_runtime.worker"]
    return [*runtime, "--", *spec.command] if spec.command else [*runtime, spec.target]


class LocalJob:
    """Runs every rank as a child process; on a worker failure stops the others and restarts all."""

    def __init__(
        self, spec: LocalJobSpec, on_progress: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.spec = spec
        self.on_progress = on_progress
        self.processes: list[subprocess.Popen[str]] = []
        self.restarts = 0
        self._readers: list[threading.Thread] = []
        self._logs: list[IO[str]] = []

    def start(self) -> None:
        spec = self.spec
        for directory in (
            spec.work_dir,
            spec.checkpoint_dir,
            spec.work_dir / "results",
            spec.work_dir / "logs",
        ):
            directory.mkdir(parents=True, exist_ok=True)
        if not spec.plan_file.exists():
            spec.plan_file.write_text(spec.plan.to_json())
        self._launch()

    def _launch(self) -> None:
        port = free_port()
        self.processes = []
        for rank in range(self.spec.workers):
            log_handle = self.spec.log_file(rank).open("a")
            self._logs.append(log_handle)
            prefix = self.spec.launch_prefixes[rank] if self.spec.launch_prefixes else []
            process = spawn(
                [*prefix, *worker_command(self.spec)],
                env=worker_environment(self.spec, rank, port),
                stdout=subprocess.PIPE,
                stderr=log_handle,
                text=True,
                start_new_session=True,
            )
            self.processes.append(process)
            reader = threading.Thread(target=self._read_stdout, args=(rank, process), daemon=True)
            reader.start()
            self._readers.append(reader)

    def _read_stdout(self, rank: int, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            payload = parse_progress(line)
            if payload is None:
                sys.stdout.write(f"[rank {rank}] {line}")
            elif self.on_progress is not None:
                self.on_progress(payload)

    def kill_rank(self, rank: int) -> None:
        """Kill one worker abruptly (SIGKILL), as a node loss would."""
        self.processes[rank].send_signal(signal.SIGKILL)

    def run(self, timeout_seconds: float) -> int:
        """Start, wait as `wait` does, and stop whatever still runs: a timeout or an interrupt leaves
        no worker behind."""
        self.start()
        try:
            return self.wait(timeout_seconds)
        finally:
            self.stop()

    def wait(self, timeout_seconds: float) -> int:
        """Run to completion, restarting after failures; returns 0 on success, else the failing code."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            codes = [p.poll() for p in self.processes]
            if all(code == 0 for code in codes):
                for reader in self._readers:  # deliver the last progress lines before returning
                    reader.join(timeout=5)
                self._close_logs()
                return 0
            failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0)]
            if failed:
                self.stop()
                rank, code = failed[0]
                if self.restarts >= self.spec.max_restarts:
                    return code or 1
                self.restarts += 1
                log.warning(
                    "rank %d exited with %s; restart %d from the last checkpoint. Its log ends:\n%s",
                    rank,
                    code,
                    self.restarts,
                    self._log_tail(rank),
                )
                self._launch()
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"local job did not finish within {timeout_seconds:.0f}s")
            time.sleep(0.05)

    def _log_tail(self, rank: int, lines: int = 25) -> str:
        try:
            return "\n".join(self.spec.log_file(rank).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Terminate every still-running worker of the current launch (SIGTERM, then SIGKILL)."""
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        end = time.monotonic() + 5
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for reader in self._readers:
            reader.join(timeout=1)
        self._readers = []
        self._close_logs()

    def _close_logs(self) -> None:
        for handle in self._logs:
            handle.close()
        self._logs = []

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(self.spec.result_file(rank).read_text()) for rank in range(self.spec.workers)]
