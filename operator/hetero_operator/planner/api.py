"""Solve a planning request given as a contract model (the layer under `heterotrain plan`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from hetero_operator.planner import contracts as c
from hetero_operator.planner.batch import ClusterModel, WorkerModel, optimal_split
from hetero_operator.planner.dreamddp import schedule
from hetero_operator.planner.esync import local_steps
from hetero_operator.planner.pipeline import Gpu, Layer, Link, Links, partition_pipeline
from hetero_operator.planner.sesgd import group_schedule
from hetero_operator.planner.virtual_workers import Node, Policy, allocate_virtual_workers


def cluster_from_request(req: c.BatchRequest) -> ClusterModel:
    workers = tuple(
        WorkerModel.from_components(
            w.q, w.s, w.k, w.m, req.gamma, min_batch=w.min_batch, max_batch=w.max_batch, name=w.name
        )
        for w in req.workers
    )
    return ClusterModel(workers, t_o=req.t_o, t_u=req.t_u)


def solve_batch(req: c.BatchRequest) -> c.BatchResponse:
    split = optimal_split(cluster_from_request(req), req.global_batch)
    return c.BatchResponse(local_batches=list(split.local_batches), iteration_time=split.iteration_time)


def _link(link: c.PipelineLink) -> Link:
    return Link(latency_ms=link.latency_ms, mb_per_ms=link.mb_per_ms)


def solve_pipeline(req: c.PipelineRequest) -> c.PipelineResponse:
    plan = partition_pipeline(
        [Layer(x.time, x.activation_mb, x.param_mb, x.stash_mb) for x in req.layers],
        [Gpu(g.name, g.speed, g.memory_mb, g.node) for g in req.gpus],
        req.nm,
        Links(_link(req.links.same_node), _link(req.links.cross_node)),
        fixed_order=req.fixed_order,
    )
    return c.PipelineResponse(
        order=list(plan.order),
        stages=[list(s) for s in plan.stages],
        stage_ms=list(plan.stage_ms),
        bottleneck_ms=plan.bottleneck_ms,
    )


def solve_dreamddp(req: c.DreamDdpRequest) -> c.DreamDdpResponse:
    s = schedule(req.H, req.forward_ms, req.backward_ms, req.comm_ms)
    return c.DreamDdpResponse(
        phases=[list(p) for p in s.phases],
        extra=[list(e) for e in s.extra],
        iteration_ms=list(s.iteration_ms),
        period_ms=s.period_ms,
        exposed_ms=s.exposed_ms,
    )


def solve_esync(req: c.EsyncRequest) -> c.EsyncResponse:
    return c.EsyncResponse(local_steps=local_steps(req.step_ms, req.epsilon_ms))


def solve_sesgd(req: c.SesgdRequest) -> c.SesgdResponse:
    return c.SesgdResponse(groups=group_schedule(req.n, req.k, req.seed, req.steps))


def solve_vw(req: c.VwRequest) -> c.VwResponse:
    nodes = [Node(n.name, n.gpu_class, n.gpus, n.speed, n.memory_gb) for n in req.nodes]
    alloc = allocate_virtual_workers(nodes, req.k, Policy(req.policy))
    return c.VwResponse(
        virtual_workers=[
            [c.VwSlot(node=s.node, gpu_index=s.gpu_index) for s in vw] for vw in alloc.virtual_workers
        ],
        policy=alloc.policy.value,
    )


@dataclass(frozen=True, slots=True)
class Kind:
    request: type[BaseModel]
    solve: Callable[[Any], BaseModel]


KINDS: dict[str, Kind] = {
    "batch": Kind(c.BatchRequest, solve_batch),
    "pipeline": Kind(c.PipelineRequest, solve_pipeline),
    "dreamddp": Kind(c.DreamDdpRequest, solve_dreamddp),
    "esync": Kind(c.EsyncRequest, solve_esync),
    "sesgd": Kind(c.SesgdRequest, solve_sesgd),
    "vw": Kind(c.VwRequest, solve_vw),
}


def solve_json(kind: str, text: str) -> str:
    """Parse ``text`` as the request of ``kind``, solve, and return the response as JSON.

    Raises ``pydantic.ValidationError`` for malformed input and ``PlanningError`` when no plan exists.
    """
    spec = KINDS[kind]
    request = spec.request.model_validate_json(text)
    return spec.solve(request).model_dump_json()
