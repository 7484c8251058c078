"""The operator's HTTP API: pools, jobs and what-if placement, for users holding a Kubernetes token.

Every `/api/v1` request carries `Authorization: Bearer <token>`; the token is checked with a
TokenReview and the endpoint's read with a SubjectAccessReview, so the API grants nobody more than
Kubernetes RBAC already does. Reads use the operator's own credentials once the caller is allowed.
`/healthz`, `/readyz` and `/metrics` are open, for probes and Prometheus.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Body, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from hetero_operator.api.access import KubernetesAccess, Permission
from hetero_operator.api.cluster import live_snapshot, read_view
from hetero_operator.api.dependencies import AccessDep, CallerDep, KubeDep, authorize
from hetero_operator.api.examples import WHAT_IF_EXAMPLES
from hetero_operator.api.health import Check, Heartbeat, details, passed
from hetero_operator.api.jobs import job_detail, job_summary
from hetero_operator.api.kube import KubeReader, KubeReadError
from hetero_operator.api.metrics import ApiMetrics
from hetero_operator.api.models import (
    Health,
    JobDetail,
    JobList,
    PoolList,
    PoolSource,
    Problem,
    Readiness,
    WhatIfRequest,
    WhatIfResult,
    WorkloadList,
)
from hetero_operator.api.pools import pools, workload_summaries
from hetero_operator.api.settings import ApiSettings
from hetero_operator.api.whatif import WhatIfError, pool_snapshot, what_if
from hetero_operator.controller.facts import JobFacts
from hetero_operator.resources import MeasuredProfile
from hetero_operator.resources.base import DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN
from hetero_operator.scheduler import SnapshotError

API_PREFIX = "/api/v1"
JOBS = "heterotrainjobs"
CLASSES = "gpuclasses"
PROFILES = "workloadprofiles"

UNAUTHENTICATED = {"model": Problem, "description": "No bearer token, or the API server rejected it."}
FORBIDDEN = {"model": Problem, "description": "RBAC does not allow the caller this read."}
UNAVAILABLE = {"model": Problem, "description": "The Kubernetes API server could not be read."}
GUARDED: dict[int | str, dict[str, Any]] = {401: UNAUTHENTICATED, 403: FORBIDDEN, 503: UNAVAILABLE}


NamespacePath = Annotated[str, Path(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN)]
NamePath = Annotated[str, Path(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)]
NamespaceQuery = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="Only jobs in this namespace; unset: every namespace (needs a cluster-wide list right).",
    ),
]


# --- the application -----------------------------------------------------------------------------


def create_app(settings: ApiSettings | None = None) -> FastAPI:
    """The API as an ASGI app; its lifespan opens (and closes) the read-only Kubernetes client."""
    settings = settings or ApiSettings()
    connection = settings.kube_connection()
    metrics = ApiMetrics(settings.registry)

    heartbeat = Heartbeat(max_stall_seconds=settings.max_event_loop_stall_seconds)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        beating = asyncio.create_task(heartbeat.run(), name="API event-loop heartbeat")
        try:
            async with KubeReader(connection, timeout=settings.request_timeout_seconds) as kube:
                app.state.kube = kube
                app.state.access = KubernetesAccess(kube)
                yield
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    app = FastAPI(
        title="heterotrain operator API",
        version="v1",
        description=__doc__,
        lifespan=lifespan,
    )
    app.state.settings = settings

    @app.middleware("http")
    async def count_requests(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", "unmatched")
        metrics.observe(route, request.method, response.status_code, time.perf_counter() - started)
        return response

    @app.exception_handler(KubeReadError)
    async def kubernetes_unavailable(_request: Request, error: KubeReadError) -> JSONResponse:
        detail = f"the Kubernetes API could not be read: {error}"
        return JSONResponse(status_code=503, content=Problem(detail=detail).model_dump())

    @app.exception_handler(SnapshotError)
    async def inconsistent_cluster(_request: Request, error: SnapshotError) -> JSONResponse:
        detail = f"the cluster's state cannot be planned against right now: {error}"
        return JSONResponse(status_code=503, content=Problem(detail=detail).model_dump())

    _probes(app, settings, heartbeat)
    _pools_and_jobs(app)
    _what_if(app, settings)
    return app


def _probes(app: FastAPI, settings: ApiSettings, heartbeat: Heartbeat) -> None:
    @app.get(
        "/healthz",
        response_model=Health,
        tags=["probes"],
        responses={503: {"model": Health, "description": "Failing; `checks` says why."}},
    )
    async def healthz() -> Any:
        """Liveness: the event loop serving the API runs its heartbeat, and the host's long-running
        tasks (the operator's scheduling loop) are still running."""
        checks = {"eventLoop": heartbeat.check()}
        if settings.host is not None:
            checks.update(settings.host.liveness())
        body = Health(status="ok" if passed(checks) else "failing", checks=details(checks))
        if passed(checks):
            return body
        return JSONResponse(status_code=503, content=body.model_dump(by_alias=True))

    @app.get(
        "/readyz",
        response_model=Readiness,
        tags=["probes"],
        responses={503: {"model": Readiness, "description": "Not ready; `checks` says why."}},
    )
    async def readyz(kube: KubeDep) -> Any:
        """Readiness: the Kubernetes API server answers, and the host is ready (the operator: its kopf
        indexes have synced, or it stands by for another replica)."""
        checks = {"kubernetes": await _api_server_check(kube, settings.probe_timeout_seconds)}
        if settings.host is not None:
            checks.update(settings.host.readiness())
        body = Readiness(ready=passed(checks), checks=details(checks))
        if body.ready:
            return body
        return JSONResponse(status_code=503, content=body.model_dump(by_alias=True))

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        tags=["probes"],
        responses={
            200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Metrics"}
        },
    )
    async def metrics_text() -> PlainTextResponse:
        """Prometheus text exposition of the operator's registry."""
        return PlainTextResponse(generate_latest(settings.registry), media_type=CONTENT_TYPE_LATEST)


async def _api_server_check(kube: KubeReader, timeout: float) -> Check:
    try:
        await asyncio.wait_for(kube.version(), timeout)
    except KubeReadError as error:
        return Check(False, str(error))
    except TimeoutError:
        return Check(False, f"the Kubernetes API server did not answer within {timeout:.0f} s")
    return Check(True)


def _pools_and_jobs(app: FastAPI) -> None:
    @app.get(f"{API_PREFIX}/pools", response_model=PoolList, responses=GUARDED, tags=["pools"])
    async def list_pools(caller: CallerDep, access: AccessDep, kube: KubeDep) -> PoolList:
        """Per GPUClass: its nodes and their GPUs in total, allocated and free. Needs `list gpuclasses`."""
        await authorize(access, caller, Permission("list", CLASSES))
        view = await read_view(kube, catalog=False)  # capacity needs no speeds
        return PoolList(pools=pools(live_snapshot(view, time.time())))

    @app.get(f"{API_PREFIX}/workloads", response_model=WorkloadList, responses=GUARDED, tags=["pools"])
    async def list_workloads(caller: CallerDep, access: AccessDep, kube: KubeDep) -> WorkloadList:
        """The throughput catalog: per workload key, the samples/s of one GPU of each class its jobs
        measured, how many jobs it keeps and when the last arrived. Needs `list workloadprofiles`."""
        await authorize(access, caller, Permission("list", PROFILES))
        return WorkloadList(items=workload_summaries(await kube.workload_profiles()))

    @app.get(f"{API_PREFIX}/jobs", response_model=JobList, responses=GUARDED, tags=["jobs"])
    async def list_jobs(
        caller: CallerDep, access: AccessDep, kube: KubeDep, namespace: NamespaceQuery = None
    ) -> JobList:
        """HeteroTrainJobs with phase, GPUs and progress. Needs `list heterotrainjobs` in the namespace."""
        await authorize(access, caller, Permission("list", JOBS, namespace))
        bodies = await kube.jobs(namespace)
        facts = sorted((JobFacts.from_body(body) for body in bodies), key=lambda f: (f.namespace, f.name))
        return JobList(items=[job_summary(f) for f in facts])

    @app.get(
        f"{API_PREFIX}/jobs/{{namespace}}/{{name}}",
        response_model=JobDetail,
        responses={**GUARDED, 404: {"model": Problem, "description": "No such job."}},
        tags=["jobs"],
    )
    async def get_job(
        namespace: NamespacePath, name: NamePath, caller: CallerDep, access: AccessDep, kube: KubeDep
    ) -> JobDetail:
        """Allocation, plan, progress, rebalance history and conditions. Needs `get heterotrainjobs`."""
        await authorize(access, caller, Permission("get", JOBS, namespace, name))
        body = await kube.job(namespace, name)
        if body is None:
            raise HTTPException(404, f"no HeteroTrainJob {name!r} in namespace {namespace!r}")
        return job_detail(JobFacts.from_body(body))


def _what_if(app: FastAPI, settings: ApiSettings) -> None:
    @app.post(f"{API_PREFIX}/whatif", response_model=WhatIfResult, responses=GUARDED, tags=["what-if"])
    async def post_what_if(
        request: Annotated[WhatIfRequest, Body(openapi_examples=WHAT_IF_EXAMPLES)],
        caller: CallerDep,
        access: AccessDep,
        kube: KubeDep,
    ) -> WhatIfResult:
        """Where the scheduler would place this job now, its predicted throughput and first batch split,
        or why each GPUClass cannot take it. Nothing is created. Needs `list heterotrainjobs` in the
        namespace, and `list gpuclasses` when planning against the live pool."""
        needed = [Permission("list", JOBS, request.namespace)]
        if request.pool is None:
            needed.append(Permission("list", CLASSES))
        await authorize(access, caller, *needed)
        source: PoolSource
        catalog: Mapping[str, MeasuredProfile] = {}
        if request.pool is not None:
            try:
                base = pool_snapshot(request.pool)
            except SnapshotError as error:
                raise _invalid("pool", error) from None
            speeds = {c.name: c.relative_speed for c in request.pool.classes}
            source = "request"
        else:
            view = await read_view(kube)
            base, speeds, source = live_snapshot(view, time.time()), view.speeds(), "live"
            catalog = view.profiles
        try:
            # A cycle over a large pool takes a while: keep the event loop (and the operator) free.
            return await asyncio.to_thread(
                what_if, request, base, speeds, source, settings.scheduler, catalog
            )
        except WhatIfError as error:
            raise _invalid("spec", error) from None


def _invalid(field: str, error: Exception) -> RequestValidationError:
    """A 422 in FastAPI's usual shape, so every validation error reads the same."""
    return RequestValidationError([{"loc": ("body", field), "msg": str(error), "type": "value_error"}])
