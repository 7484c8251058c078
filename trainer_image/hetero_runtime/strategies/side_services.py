"""Starting and reaching a job's side services (ESync's state service, HetPipe's parameter server):
rank 0 runs them on its own address; every rank connects from its own address with the job's token."""

from __future__ import annotations

import secrets
import subprocess
from typing import Any

import torch.distributed as dist

from hetero_operator.plan import ESyncParams, HetPipeParams
from hetero_runtime.esync_service import StateClient, start_service_process
from hetero_runtime.hetpipe_ps import ParameterServerClient, start_server_process
from hetero_runtime.job_peers import JobPeers, own_address
from hetero_runtime.launcher import WorkerEnv
from hetero_runtime.strategies.base import WorkerContext


def gather_peers(own: str, rank: int, world_size: int) -> JobPeers:
    """Every rank's address and rank 0's fresh token, through the process group (all ranks call it)."""
    if world_size == 1:
        return JobPeers(secrets.token_hex(16), (own,))
    addresses: list[Any] = [None] * world_size
    dist.all_gather_object(addresses, own)
    holder: list[Any] = [secrets.token_hex(16) if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return JobPeers(str(holder[0]), tuple(str(a) for a in addresses))


def _peers(env: WorkerEnv) -> tuple[JobPeers, str]:
    own = own_address(env.pod_ip, env.master_addr)
    return gather_peers(own, env.rank, env.world_size), own


def shared_port(port: int, rank: int, world_size: int) -> int:
    """Rank 0's `port`, on every rank (all ranks call it)."""
    if world_size == 1:
        return port
    holder: list[Any] = [port if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    return int(holder[0])


def connect_state_service(
    env: WorkerEnv, params: ESyncParams
) -> tuple[subprocess.Popen[bytes] | None, StateClient]:
    """Rank 0 starts ESync's state service (on the plan's port, or one the system chooses); every
    rank connects to it (all ranks call it)."""
    peers, own = _peers(env)
    process, port = None, params.state_service_port
    if env.rank == 0:
        process, port = start_service_process(
            peers, peers.addresses[0], port, env.world_size, params.margin_seconds
        )
    port = shared_port(port, env.rank, env.world_size)
    client = StateClient(peers.addresses[0], port, own, env.rank, peers.token)
    return process, client


def connect_parameter_server(
    ctx: WorkerContext, params: HetPipeParams
) -> tuple[subprocess.Popen[bytes] | None, ParameterServerClient]:
    """Rank 0 starts HetPipe's parameter server (on a port the system chooses); every rank connects."""
    peers, own = _peers(ctx.env)
    process, port = None, 0
    if ctx.rank == 0:
        stages = [len(vw) for vw in params.virtual_workers]
        process, port = start_server_process(peers, peers.addresses[0], 0, stages)
    port = shared_port(port, ctx.rank, ctx.world_size)
    client = ParameterServerClient(peers.addresses[0], port, own, ctx.rank, peers.token)
    return process, client
