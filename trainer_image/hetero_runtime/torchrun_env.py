"""The environment `torchrun` gives each process, derived from what the operator gives a worker pod.

A DDP script launched by torchrun reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR
and MASTER_PORT (and sometimes the group, role and elastic variables); `heterotrain worker -- CMD`
sets them all, then runs CMD in its place, so such a script runs unmodified.
"""

from __future__ import annotations

from collections.abc import Mapping

from hetero_operator import metric_names as names
from hetero_operator.plan import LOCAL_WORLD_SIZE_ENV
from hetero_runtime.launcher import WorkerEnv, WorkerEnvError

__all__ = ["LOCAL_WORLD_SIZE_ENV", "local_world_size", "torchrun_environment"]


def local_world_size(environ: Mapping[str, str], local_rank: int) -> int:
    raw = environ.get(LOCAL_WORLD_SIZE_ENV) or "1"
    try:
        size = int(raw)
    except ValueError:
        raise WorkerEnvError(f"{LOCAL_WORLD_SIZE_ENV}={raw!r} is not an integer") from None
    if size < 1 or local_rank >= size:
        raise WorkerEnvError(
            f"{LOCAL_WORLD_SIZE_ENV}={size} must be >= 1 and above LOCAL_RANK={local_rank}: set it to the "
            "number of workers on this host"
        )
    return size


def torchrun_environment(env: WorkerEnv, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables torchrun would set for this worker (pure: the caller merges them in)."""
    per_host = local_world_size(environ, env.local_rank)
    variables = {
        "RANK": str(env.rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_RANK": str(env.local_rank),
        LOCAL_WORLD_SIZE_ENV: str(per_host),
        "GROUP_RANK": str(env.rank // per_host),
        "GROUP_WORLD_SIZE": str(max(1, env.world_size // per_host)),
        "ROLE_NAME": "default",
        "ROLE_RANK": str(env.rank),
        "ROLE_WORLD_SIZE": str(env.world_size),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
        "TORCHELASTIC_RUN_ID": environ.get(names.JOB_NAME_ENV, "local"),
        "TORCHELASTIC_RESTART_COUNT": environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
        "TORCHELASTIC_MAX_RESTARTS": environ.get("TORCHELASTIC_MAX_RESTARTS", "0"),
    }
    if "OMP_NUM_THREADS" not in environ and per_host > 1:
        variables["OMP_NUM_THREADS"] = "1"  # as torchrun does when several processes share a host
    return variables
