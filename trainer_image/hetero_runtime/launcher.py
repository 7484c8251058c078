"""The worker's view of its environment, as the operator's pods (or run-local) set it."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hetero_operator import metric_names as names
from hetero_operator import plan as plan_contract


class WorkerEnvError(ValueError):
    """A worker environment variable is missing or malformed."""


@dataclass(frozen=True)
class WorkerEnv:
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    plan_source: str | None
    metrics_port: int | None
    job_name: str
    gpu_class: str
    simulated_speed: float | None
    checkpoint_dir: Path | None
    checkpoint_every_epochs: int
    epochs: int | None
    seed: int
    result_file: Path | None
    local_rank: int = 0
    precision: plan_contract.Precision = plan_contract.Precision.AUTO
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    backend: str = "auto"  # auto (nccl on CUDA, else gloo) | nccl | gloo
    annotations_file: Path | None = None
    pod_ip: str | None = None
    simulated_speed_file: Path | None = None

    @property
    def init_method(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"


def _int(environ: Mapping[str, str], key: str, default: int | None = None, minimum: int = 0) -> int:
    raw = environ.get(key)
    if raw is None or raw == "":
        if default is None:
            raise WorkerEnvError(f"{key} is not set: the launcher must export it (an integer >= {minimum})")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise WorkerEnvError(f"{key}={raw!r} is not an integer") from None
    if value < minimum:
        raise WorkerEnvError(f"{key}={value} must be >= {minimum}")
    return value


def parse_simulated_speed(raw: str | None) -> float | None:
    """The HETEROTRAIN_SIMULATED_SPEED factor in (0, 1], or None when unset."""
    if raw is None or raw.strip() == "":
        return None
    try:
        speed = float(raw)
    except ValueError:
        raise WorkerEnvError(f"{plan_contract.SIMULATED_SPEED_ENV}={raw!r} is not a number") from None
    if not 0.0 < speed <= 1.0:
        raise WorkerEnvError(
            f"{plan_contract.SIMULATED_SPEED_ENV}={speed} must be in (0, 1]: it is the fraction of full speed"
        )
    return speed


DEVICE_ENV = "HETEROTRAIN_DEVICE"
BACKEND_ENV = "HETEROTRAIN_DIST_BACKEND"
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def parse_precision(raw: str | None) -> plan_contract.Precision:
    if raw is None or raw.strip() == "":
        return plan_contract.Precision.AUTO
    try:
        return plan_contract.Precision(raw.strip().lower())
    except ValueError:
        choices = ", ".join(p.value for p in plan_contract.Precision)
        raise WorkerEnvError(f"{plan_contract.PRECISION_ENV}={raw!r}: use one of {choices}") from None


def _choice(environ: Mapping[str, str], key: str, allowed: re.Pattern[str], hint: str) -> str:
    value = (environ.get(key) or "auto").strip().lower()
    if not allowed.match(value):
        raise WorkerEnvError(f"{key}={value!r}: use {hint}")
    return value


def parse_worker_env(environ: Mapping[str, str]) -> WorkerEnv:
    """Read and check every worker setting; raises WorkerEnvError naming the variable."""
    world_size = _int(environ, plan_contract.WORLD_SIZE_ENV, 1, minimum=1)
    rank = _int(environ, plan_contract.RANK_ENV, 0)
    if rank >= world_size:
        raise WorkerEnvError(f"RANK={rank} must be < WORLD_SIZE={world_size}")
    port = _int(environ, plan_contract.MASTER_PORT_ENV, 29500 if world_size == 1 else None, minimum=1)
    if port > 65535:
        raise WorkerEnvError(f"MASTER_PORT={port} is not a TCP port")
    metrics_raw = environ.get(names.METRICS_PORT_ENV)
    metrics_port = None if metrics_raw in (None, "", "off") else _int(environ, names.METRICS_PORT_ENV)
    checkpoint_dir = environ.get(plan_contract.CHECKPOINT_DIR_ENV) or None
    if rank != 0 and environ.get(plan_contract.CHECKPOINT_RANK0_ONLY_ENV, "").strip().lower() in (
        "1",
        "true",
    ):
        checkpoint_dir = None  # not mounted on this rank's pod: rank 0 sends the state instead
    epochs_raw = environ.get(plan_contract.EPOCHS_ENV)
    result_file = environ.get(plan_contract.RESULT_FILE_ENV) or None
    annotations = environ.get(plan_contract.POD_ANNOTATIONS_FILE_ENV) or None
    speed_file = environ.get(plan_contract.SIMULATED_SPEED_FILE_ENV) or None
    return WorkerEnv(
        rank=rank,
        world_size=world_size,
        master_addr=environ.get(plan_contract.MASTER_ADDR_ENV, "127.0.0.1"),
        master_port=port,
        plan_source=environ.get(plan_contract.PLAN_SOURCE_ENV) or None,
        metrics_port=metrics_port,
        job_name=environ.get(names.JOB_NAME_ENV, "local"),
        gpu_class=environ.get(names.GPU_CLASS_ENV, "cpu"),
        simulated_speed=parse_simulated_speed(environ.get(plan_contract.SIMULATED_SPEED_ENV)),
        checkpoint_dir=Path(checkpoint_dir) if checkpoint_dir else None,
        checkpoint_every_epochs=_int(environ, plan_contract.CHECKPOINT_EVERY_ENV, 1, minimum=1),
        epochs=None if not epochs_raw else _int(environ, plan_contract.EPOCHS_ENV, minimum=1),
        seed=_int(environ, plan_contract.SEED_ENV, 0),
        result_file=Path(result_file) if result_file else None,
        local_rank=_int(environ, plan_contract.LOCAL_RANK_ENV, 0),
        precision=parse_precision(environ.get(plan_contract.PRECISION_ENV)),
        device=_choice(environ, DEVICE_ENV, _DEVICE, "auto, cpu, cuda or cuda:N"),
        backend=_choice(environ, BACKEND_ENV, re.compile(r"^(auto|nccl|gloo)$"), "auto, nccl or gloo"),
        annotations_file=Path(annotations) if annotations else None,
        pod_ip=environ.get("POD_IP") or None,
        simulated_speed_file=Path(speed_file) if speed_file else None,
    )


def worker_env_from_os() -> WorkerEnv:
    return parse_worker_env(os.environ)
