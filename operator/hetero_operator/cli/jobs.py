"""Everyday user commands: `jobs`, `describe`, `whatif`, `logs`, and `api` (the HTTP API alone).

They read the cluster with the caller's kubeconfig (so RBAC applies as for kubectl) and never write to
it: `whatif` runs the operator's scheduler over a snapshot in this process. The lead registers them:
`jobs_command`, `describe_command`, `whatif_command`, `logs_command`, `api_command`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
import yaml
from kubernetes import config as kube_config
from pydantic import ValidationError
from rich.console import Console

from hetero_operator.api import ApiSettings, create_app, serve_until_signalled
from hetero_operator.api.cluster import live_snapshot, read_view
from hetero_operator.api.jobs import job_detail, job_summary
from hetero_operator.api.kube import KubeConnection, KubeReader, KubeReadError
from hetero_operator.api.models import WhatIfRequest
from hetero_operator.api.whatif import WhatIfError, what_if
from hetero_operator.cli import job_tables, queue_tables
from hetero_operator.controller import names
from hetero_operator.controller.facts import JobFacts
from hetero_operator.resources import HeteroQueue, InvalidResourceError
from hetero_operator.resources.base import describe_errors
from hetero_operator.testbed.nodes import LOCAL_NODE_LABEL

T = TypeVar("T")

FAILED = 1
INVALID_INPUT = 2


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


KubeconfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--kubeconfig", help="Kubeconfig file (default: KUBECONFIG or ~/.kube/config).", dir_okay=False
    ),
]
ContextOpt = Annotated[str | None, typer.Option("--context", help="Kubeconfig context to use.")]
NamespaceOpt = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace (default: the context's, else 'default').")
]
OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table for people, json for scripts.")]


# --- plumbing ------------------------------------------------------------------------------------


def _console() -> Console:
    return Console(width=int(os.environ.get("COLUMNS", "160")))


def _fail(message: str, code: int = FAILED) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _connect(kubeconfig: Path | None, context: str | None) -> KubeConnection:
    try:
        return KubeConnection.discover(kubeconfig, context)
    except (kube_config.ConfigException, OSError) as error:
        raise _fail(f"--kubeconfig: cannot load credentials: {error}") from None


def _read(kubeconfig: Path | None, context: str | None, work: Callable[[KubeReader], Awaitable[T]]) -> T:
    """Run ``work`` with a read-only client; API errors become a one-line message and exit 1."""
    connection = _connect(kubeconfig, context)

    async def run() -> T:
        async with KubeReader(connection) as kube:
            return await work(kube)

    try:
        return asyncio.run(run())
    except KubeReadError as error:
        raise _fail(f"cannot read from the Kubernetes API: {error}") from None


def default_namespace(kubeconfig: Path | None, context: str | None) -> str:
    """The kubeconfig context's namespace, like kubectl; 'default' without one."""
    try:
        contexts, active = kube_config.list_kube_config_contexts(str(kubeconfig) if kubeconfig else None)
    except (kube_config.ConfigException, OSError):
        return "default"
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


# --- jobs and describe ---------------------------------------------------------------------------


def jobs_command(
    namespace: NamespaceOpt = None,
    all_namespaces: Annotated[
        bool, typer.Option("--all-namespaces", "-A", help="Jobs in every namespace.")
    ] = False,
    output: OutputOpt = Output.TABLE,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """List HeteroTrainJobs: phase, GPUs per class, epoch, throughput and why a job waits."""
    scope = None if all_namespaces else (namespace or default_namespace(kubeconfig, context))
    bodies = _read(kubeconfig, context, lambda kube: kube.jobs(scope))
    facts = sorted((JobFacts.from_body(b) for b in bodies), key=lambda f: (f.namespace, f.name))
    summaries = [job_summary(f) for f in facts]
    if output is Output.JSON:
        _print_json([s.model_dump(mode="json", by_alias=True) for s in summaries])
        return
    if not summaries:
        typer.echo("No HeteroTrainJobs found" + (f" in namespace {scope}." if scope else "."))
        return
    _console().print(job_tables.jobs_table(summaries, show_namespace=scope is None))


DESCRIBABLE = ("job", "queue")


def describe_command(
    target: Annotated[str, typer.Argument(help="HeteroTrainJob name, or 'job'/'queue' before a NAME.")],
    name: Annotated[str | None, typer.Argument(help="Name, after 'job' or 'queue'.")] = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.TABLE,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """One job (`describe JOB`: allocation, plan, throughput, rebalances, conditions) or one queue
    (`describe queue NAME`: quota, usage and borrowing per GPU class, share and its jobs)."""
    if name is None:
        job = target
    elif target == "queue":
        _describe_queue(name, output, kubeconfig, context)
        return
    elif target == "job":
        job = name
    else:
        raise _fail(f"TARGET: {target!r} is not one of {', '.join(DESCRIBABLE)}; e.g. `describe queue NAME`")
    scope = namespace or default_namespace(kubeconfig, context)
    body = _read(kubeconfig, context, lambda kube: kube.job(scope, job))
    if body is None:
        raise _fail(f"JOB: no HeteroTrainJob {job!r} in namespace {scope!r} (try `heterotrain jobs -A`)")
    detail = job_detail(JobFacts.from_body(body))
    if output is Output.JSON:
        _print_json(detail.model_dump(mode="json", by_alias=True))
        return
    _console().print(job_tables.describe_job(detail))


def _describe_queue(name: str, output: Output, kubeconfig: Path | None, context: str | None) -> None:
    async def read(kube: KubeReader) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
        return await kube.queue(name), await kube.jobs(None)

    body, bodies = _read(kubeconfig, context, read)
    if body is None:
        raise _fail(f"NAME: no HeteroQueue {name!r} (try `kubectl get heteroqueues`)")
    try:
        queue = HeteroQueue.from_k8s(body)
    except InvalidResourceError as error:
        raise _fail(str(error)) from None
    jobs = [job_summary(f) for f in (JobFacts.from_body(b) for b in bodies)]
    mine = [j for j in jobs if j.queue == name]
    if output is Output.JSON:
        _print_json(
            {"queue": queue.to_k8s(), "jobs": [j.model_dump(mode="json", by_alias=True) for j in mine]}
        )
        return
    _console().print(queue_tables.describe_queue(queue, mine))


# --- whatif --------------------------------------------------------------------------------------


def what_if_request(
    document: Any, namespace: str | None, fallback_namespace: str = "default"
) -> WhatIfRequest:
    """A HeteroTrainJob manifest (or a bare spec) as a what-if request; raises ValueError naming fields.
    The namespace is ``namespace``, else the manifest's, else ``fallback_namespace``."""
    if not isinstance(document, Mapping):
        raise ValueError("SPEC: expected a HeteroTrainJob manifest or a spec mapping")
    if "spec" in document:
        metadata = document.get("metadata") or {}
        spec = document["spec"]
    else:
        metadata, spec = {}, document
    fields: dict[str, Any] = {"spec": spec}
    if metadata.get("name"):
        fields["name"] = metadata["name"]
    fields["namespace"] = namespace or metadata.get("namespace") or fallback_namespace
    try:
        return WhatIfRequest.model_validate(fields)
    except ValidationError as error:
        raise ValueError("\n".join(describe_errors(error))) from None


def whatif_command(
    spec_file: Annotated[
        Path, typer.Argument(metavar="SPEC.yaml", help="HeteroTrainJob manifest, or - for stdin.")
    ],
    namespace: NamespaceOpt = None,
    output: OutputOpt = Output.TABLE,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Where the operator would place a job right now and how fast it would train. Creates nothing."""
    text = sys.stdin.read() if str(spec_file) == "-" else _read_file(spec_file)
    try:
        fallback = default_namespace(kubeconfig, context)
        request = what_if_request(yaml.safe_load(text), namespace, fallback)
    except (ValueError, yaml.YAMLError) as error:
        raise _fail(f"invalid job in {spec_file}:\n{error}", INVALID_INPUT) from None

    async def live(kube: KubeReader) -> Any:
        view = await read_view(kube)
        return view, live_snapshot(view, time.time())

    view, snapshot = _read(kubeconfig, context, live)
    try:
        result = what_if(request, snapshot, view.speeds(), "live", catalog=view.profiles)
    except WhatIfError as error:
        raise _fail(f"invalid job in {spec_file}: {error}", INVALID_INPUT) from None
    if output is Output.JSON:
        _print_json(result.model_dump(mode="json", by_alias=True))
        return
    _console().print(job_tables.what_if_view(result))


def _read_file(path: Path) -> str:
    if not path.is_file():
        raise _fail(f"SPEC.yaml: {path} does not exist", INVALID_INPUT)
    return path.read_text()


# --- logs ----------------------------------------------------------------------------------------


def _label_int(pod: Mapping[str, Any], label: str) -> int:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(label, "")
    return int(value) if str(value).isdigit() else -1


def worker_pods(pods: Sequence[Mapping[str, Any]], rank: int | None) -> list[Mapping[str, Any]]:
    """The newest worker generation's pods, by rank (only ``rank`` when given)."""
    if not pods:
        return []
    newest = max(_label_int(p, names.LABEL_GENERATION) for p in pods)
    chosen = [p for p in pods if _label_int(p, names.LABEL_GENERATION) == newest]
    if rank is not None:
        chosen = [p for p in chosen if _label_int(p, names.LABEL_RANK) == rank]
    return sorted(chosen, key=lambda p: _label_int(p, names.LABEL_RANK))


def local_log_path(local_pods: Path, pod: Mapping[str, Any]) -> Path:
    """Where the test bed's local process node agent writes a pod's output."""
    metadata = pod.get("metadata") or {}
    uid = str(metadata.get("uid", ""))
    return (
        local_pods
        / "pods"
        / str(metadata.get("namespace"))
        / f"{metadata.get('name')}-{uid[:8]}"
        / "container.log"
    )


def default_local_pods(kubeconfig: Path | None) -> Path:
    """The test bed keeps its kubeconfig next to the agent's `local-pods` directory."""
    if kubeconfig is None:
        first = (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0]
        kubeconfig = Path(first) if first else Path.home() / ".kube" / "config"
    return kubeconfig.resolve().parent / "local-pods"


def _tail(text: str, lines: int | None) -> str:
    if lines is None:
        return text
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept)


def logs_command(
    job: Annotated[str, typer.Argument(help="HeteroTrainJob name.")],
    rank: Annotated[
        int | None, typer.Option("--rank", "-r", min=0, help="Only this worker (default: all).")
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", min=0, help="Only the last N lines of each worker.")
    ] = None,
    namespace: NamespaceOpt = None,
    local_pods: Annotated[
        Path | None,
        typer.Option(
            "--local-pods",
            help="The test bed's local-pods directory (default: next to the kubeconfig), for pods on "
            "local process nodes, which have no kubelet to serve logs.",
        ),
    ] = None,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Worker output of the job's current generation, from the pods/log API (or the test bed's files)."""
    scope = namespace or default_namespace(kubeconfig, context)
    local_root = local_pods or default_local_pods(kubeconfig)

    async def collect(kube: KubeReader) -> list[tuple[Mapping[str, Any], str]]:
        pods = worker_pods(await kube.pods(scope, names.job_selector(job)), rank)
        out = []
        local_nodes: dict[str, bool] = {}
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            if node and node not in local_nodes:
                body = await kube.node(node)
                labels = ((body or {}).get("metadata") or {}).get("labels") or {}
                local_nodes[node] = labels.get(LOCAL_NODE_LABEL) == "true"
            if local_nodes.get(node):
                path = local_log_path(local_root, pod)
                if not path.is_file():
                    raise _fail(f"--local-pods: no log file at {path}; point --local-pods at the test bed's")
                out.append((pod, _tail(path.read_text(errors="replace"), tail)))
            else:
                name = str(pod["metadata"]["name"])
                out.append((pod, await kube.pod_log(scope, name, names.WORKER_CONTAINER, tail)))
        return out

    logs = _read(kubeconfig, context, collect)
    if not logs:
        which = f" rank {rank}" if rank is not None else ""
        raise _fail(f"JOB: no worker pods{which} of {job!r} in namespace {scope!r}")
    for pod, text in logs:
        if len(logs) > 1:
            typer.echo(f"==> {pod['metadata']['name']} (rank {_label_int(pod, names.LABEL_RANK)}) <==")
        typer.echo(text, nl=not text.endswith("\n"))


# --- api -----------------------------------------------------------------------------------------


def api_command(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8080,
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
) -> None:
    """Serve the operator's HTTP API on its own (the operator also serves it in-process)."""
    connection = _connect(kubeconfig, context)
    app = create_app(ApiSettings(connection=connection))
    typer.echo(f"heterotrain API on http://{host}:{port} (OpenAPI at /docs)")
    asyncio.run(serve_until_signalled(app, host, port, log_level="info"))
