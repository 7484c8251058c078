"""`heterotrain simulate`: run scheduling policies over a job trace on a simulated cluster.

JSON results go to stdout (one summary per policy); plots (JCT CDF, utilisation over time) to --out.
With --queues (HeteroQueue manifests, as applied to a cluster), each trace row's tenant is the queue
its job waits in, the heterotrain policy serves queues by fair share within their quotas, and the
results add average JCT per tenant. ``--knowledge measured`` (the default) shows every policy the
speeds the operator would have measured by then (the GPU classes' priors until a job's workload key
has run); ``--knowledge oracle`` shows every job's true speeds from its arrival. ``--bound`` adds a
lower bound on the trace's average JCT that no policy can beat (`simulator.lower_bound`, from the true
speeds) and each policy's average JCT over it. Bad input exits 2 with a message naming the field.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from hetero_operator.resources import HeteroQueue, InvalidResourceError
from hetero_operator.scheduler import SchedulerConfig
from hetero_operator.scheduler.charging import Charging, Pricing
from hetero_operator.scheduler.queues import QueueInfo
from hetero_operator.simulator.cluster import Cluster, ClusterFileError, load_cluster
from hetero_operator.simulator.engine import EngineOptions, SimulationError, SimulationResult
from hetero_operator.simulator.engine import simulate as run_simulation
from hetero_operator.simulator.jobs import JobSetupError
from hetero_operator.simulator.knowledge import KnowledgeMode, KnowledgeSettings
from hetero_operator.simulator.lower_bound import BoundError, LowerBound, lower_bound
from hetero_operator.simulator.policies import POLICIES, HeterotrainPolicy, SchedulingPolicy, make_policy
from hetero_operator.simulator.report import summarize, write_plots
from hetero_operator.simulator.trace import TraceError, TraceJob, generate_trace, load_trace

INVALID_INPUT = 2


def _capacity(cluster: Cluster) -> float:
    return sum(n.gpus_allocatable * cluster.class_info(n.gpu_class).relative_speed for n in cluster.nodes)


def _fail(message: str) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(INVALID_INPUT)


def simulate(
    cluster: Annotated[Path, typer.Option("--cluster", help="Cluster YAML (classes and node groups).")],
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Trace CSV; without it a trace is generated from --seed."),
    ] = None,
    policy: Annotated[
        str, typer.Option("--policy", help=f"One of {', '.join(POLICIES)}, or 'all'.")
    ] = "heterotrain",
    out: Annotated[Path | None, typer.Option("--out", help="Directory for the PNG plots.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the generated trace.")] = 0,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Jobs in a generated trace.")] = 500,
    load: Annotated[
        float, typer.Option("--load", min=0.01, help="Offered load of a generated trace (share of capacity).")
    ] = 0.5,
    queues: Annotated[
        Path | None,
        typer.Option("--queues", help="YAML of HeteroQueue manifests; trace tenants name them."),
    ] = None,
    pricing: Annotated[
        Pricing, typer.Option("--pricing", help="What one GPU-second costs a queue (fair share).")
    ] = Pricing.SPEED,
    knowledge: Annotated[
        KnowledgeMode,
        typer.Option(
            "--knowledge", help="What policies know of job speeds: measured, or the oracle's truth."
        ),
    ] = KnowledgeMode.MEASURED,
    measurement_noise: Annotated[
        float,
        typer.Option("--measurement-noise", min=0.0, help="Std. dev. of log(measured / true speed)."),
    ] = 0.0,
    bound: Annotated[
        bool,
        typer.Option(
            "--bound", help="Also compute a lower bound on average JCT that holds for every policy."
        ),
    ] = False,
) -> None:
    """Simulate the cluster under one policy (or all) and print JSON results."""
    try:
        spec = load_cluster(cluster)
        rows: list[TraceJob] = (
            load_trace(trace, spec.class_names)
            if trace is not None
            else generate_trace(seed, jobs, _capacity(spec), load, max_gpus=_largest_job(spec), cluster=spec)
        )
        names = list(POLICIES) if policy == "all" else [policy]
        charging = Charging(pricing=pricing)
        policies = [_policy(name, charging) for name in names]
        queue_infos = _load_queues(queues, rows, spec.class_names) if queues is not None else ()
    except (ClusterFileError, TraceError, InvalidResourceError, ValueError, OSError, yaml.YAMLError) as exc:
        raise _fail(str(exc)) from None
    settings = KnowledgeSettings(mode=knowledge, noise=measurement_noise, seed=seed)
    options = EngineOptions(queues=queue_infos, charging=charging, knowledge=settings)
    results: list[SimulationResult] = []
    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=not console.is_terminal,
    ) as progress:
        for chosen in policies:
            task = progress.add_task(chosen.name, total=len(rows))

            def advance(done: int, _total: int, task: TaskID = task) -> None:
                progress.update(task, completed=done)

            try:
                results.append(run_simulation(spec, rows, chosen, options, on_finish=advance))
            except (JobSetupError, SimulationError) as exc:
                raise _fail(str(exc)) from None
    summaries: list[dict[str, Any]] = [_with_tenants(r) if queue_infos else summarize(r) for r in results]
    document = {
        "cluster": str(cluster),
        "trace": str(trace) if trace is not None else f"generated(seed={seed}, jobs={jobs}, load={load})",
        "gpus": spec.gpus_per_class(),
        "knowledge": knowledge.value,
        "results": summaries,
    }
    if bound:
        try:
            found = lower_bound(spec, rows, options)
        except BoundError as exc:
            raise _fail(str(exc)) from None
        document["lower_bound"] = _bound_summary(found)
        for summary in summaries:
            summary["avg_jct_over_bound"] = summary["avg_jct"] / found.avg_jct_s
    if out is not None:
        document["plots"] = [str(p) for p in write_plots(results, out)]
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


def _bound_summary(found: LowerBound) -> dict[str, float | int]:
    """The bound's JSON: seconds, and the size of the LP that gave it."""
    return {
        "avg_jct": found.avg_jct_s,
        "isolation_avg_jct": found.isolation_avg_jct_s,
        "avg_jct_over_isolation": found.avg_jct_s / found.isolation_avg_jct_s,
        "variables": found.variables,
        "constraints": found.constraints,
        "solves": found.rounds,
        "solve_seconds": found.solve_s,
    }


def _policy(name: str, charging: Charging) -> SchedulingPolicy:
    if name == "heterotrain":
        return HeterotrainPolicy(config=SchedulerConfig(charging=charging))
    return make_policy(name)


def _load_queues(path: Path, rows: list[TraceJob], classes: tuple[str, ...]) -> tuple[QueueInfo, ...]:
    """The HeteroQueues in ``path``; every tenant of the trace must be one, every quota a class."""
    infos = []
    for document in yaml.safe_load_all(path.read_text()):
        if document is None:
            continue
        queue = HeteroQueue.from_k8s(document)
        unknown = [q.gpu_class for q in queue.spec.quotas if q.gpu_class not in classes]
        if unknown:
            raise ValueError(
                f"HeteroQueue {queue.name!r}: spec.quotas names {', '.join(unknown)}, not a class of the "
                f"cluster ({', '.join(classes)}); fix the gpuClass or the cluster file"
            )
        infos.append(QueueInfo.from_spec(queue.name, queue.spec))
    names = {q.name for q in infos}
    missing = sorted({r.tenant for r in rows} - names)
    if missing:
        raise ValueError(
            f"trace: tenant {', '.join(missing)} names no HeteroQueue in {path}; add the queue or fix "
            "the tenant column"
        )
    return tuple(infos)


def _with_tenants(result: SimulationResult) -> dict[str, object]:
    summary = summarize(result)
    tenants = sorted({o.tenant for o in result.outcomes})
    summary["avg_jct_by_tenant"] = {
        t: sum(o.jct_s for o in result.outcomes if o.tenant == t)
        / sum(1 for o in result.outcomes if o.tenant == t)
        for t in tenants
    }
    return summary


def _largest_job(cluster: Cluster) -> int:
    """Generated jobs stay small enough for one class to hold them (baselines use one class)."""
    largest = max(cluster.gpus_per_class().values())
    size = 1
    while size * 2 <= min(32, largest // 2):
        size *= 2
    return size
