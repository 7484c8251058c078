"""`make demo`: the whole loop on this machine.

A test bed with three local process nodes (GPU classes whose priors say 1, 0.5 and 0.25; the model
truly runs at the speeds `examples/demo/nodes.yaml` sets on them), the operator, and the digits
example as a HeteroTrainJob with the product's defaults, after three baselines of the same job with
rebalancing off (even split, priors' split, fastest GPU alone). While it trains, a live view shows
epochs, per-worker local batches, throughput and rebalances; at the end a report and a plot go to
`demo-output/`.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from hetero_operator import metric_names as names
from hetero_operator.demo.report import (
    EpochRow,
    baseline_comparison,
    build_report,
    control_comparison,
    epoch_rows,
    plot,
    rank_speeds,
)
from hetero_operator.plan import PROGRESS_PREFIX
from hetero_operator.rebalance import promql
from hetero_operator.testbed import processes
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.nodes import load_node_list
from hetero_operator.testbed.versions import REPO_ROOT, cache_root

EXAMPLES = REPO_ROOT / "examples"
NAMESPACE = "demo"
TERMINAL = ("Succeeded", "Failed")


@dataclass
class DemoSettings:
    output: Path = Path("demo-output")
    timeout_seconds: float = 900.0
    keep_cluster: bool = False
    root: Path | None = None
    # Credentials of the operator (default: the test bed's admin), e.g. a ServiceAccount's token.
    operator_kubeconfig: Path | None = None
    # Epochs of each baseline run before the job (the same job with rebalancing off); 0: none.
    control_epochs: int = 4


def demo_job() -> dict[str, Any]:
    """The digits example job (examples/job-digits.yaml) in the demo's namespace."""
    job: dict[str, Any] = yaml.safe_load((EXAMPLES / "job-digits.yaml").read_text())
    job["metadata"]["namespace"] = NAMESPACE
    return job


@contextmanager
def operator_process(testbed: Testbed, log: Path, kubeconfig: Path | None = None) -> Iterator[int]:
    """The operator as a child process against the test bed, stopped on exit."""
    port = processes.free_port()
    argv = [
        sys.executable,
        "-m",
        "hetero_operator",
        "operator",
        f"--kubeconfig={kubeconfig or testbed.kubeconfig}",
        f"--metrics-port={port}",
        f"--prometheus-url={testbed.prometheus_url}",
        "--lifecycle.checkpoint-grace-seconds=5",
    ]
    launched = processes.launch("operator", argv, log.parent)
    testbed.scrape_operator(f"127.0.0.1:{port}")
    try:
        yield port
    finally:
        processes.stop(launched.pid, launched.binary)
        testbed.scrape_operator(None)


def _job(testbed: Testbed, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    result = testbed.kubectl("get", "htj", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else {}


def _worker_rates(prometheus: str, job: str) -> dict[str, float]:
    sel = f'{{{names.LABEL_NAMESPACE}="{NAMESPACE}",{names.LABEL_JOB}="{job}"}}'
    query = f"sum by ({names.LABEL_RANK}) (rate({names.total(names.SAMPLES)}{sel}[20s]))"
    try:
        body = httpx.get(f"{prometheus}/api/v1/query", params={"query": query}, timeout=3).json()
        return {r["metric"][names.LABEL_RANK]: float(r["value"][1]) for r in body["data"]["result"]}
    except (httpx.HTTPError, KeyError, ValueError):
        return {}


def _view(job: dict[str, Any], rates: dict[str, float], elapsed: float) -> Group:
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    progress = status.get("progress") or {}
    plan = status.get("plan") or {}
    header = Table.grid(padding=(0, 2))
    header.add_row(
        f"[bold]{job.get('metadata', {}).get('name', '?')}[/bold]",
        f"phase [cyan]{status.get('phase', 'Pending')}[/cyan]",
        f"epoch {progress.get('epoch', 0)}/{spec.get('epochs', '?')}",
        f"plan v{plan.get('version', '-')}",
        f"{progress.get('samplesPerSecond', 0):.0f} samples/s",
        f"{elapsed:.0f}s",
    )
    workers = Table("rank", "node", "class", "local batch", "samples/s", title="workers")
    batches = plan.get("localBatches") or []
    for worker in (status.get("allocation") or {}).get("workers", []):
        rank = worker["rank"]
        workers.add_row(
            str(rank),
            worker["node"],
            worker["gpuClass"],
            str(batches[rank]) if rank < len(batches) else "-",
            f"{rates.get(str(rank), 0.0):.0f}",
        )
    history = Table("epoch", "plan", "predicted step", "why", title="rebalances")
    for item in (status.get("rebalances") or [])[-6:]:
        history.add_row(
            str(item["epoch"]),
            f"v{item['fromVersion']} -> v{item['toVersion']}",
            f"{item['predictedIterationSeconds'] * 1000:.0f} ms",
            item.get("reason", ""),
        )
    return Group(header, workers, history)


def _summary_line(job: dict[str, Any]) -> str:
    status = job.get("status") or {}
    plan = status.get("plan") or {}
    epoch = (status.get("progress") or {}).get("epoch", 0)
    epochs = (job.get("spec") or {}).get("epochs", "?")
    return (
        f"phase {status.get('phase', 'Pending')}, epoch {epoch}/{epochs}, "
        f"plan v{plan.get('version', '-')} local batches {plan.get('localBatches', '-')}"
    )


def progress_lines(testbed: Testbed, job: str, since: float = 0.0) -> list[dict[str, Any]]:
    """What rank 0 printed per epoch, read from the local process node's log of each generation of
    the job submitted at `since` (wall-clock seconds): an earlier job of the same name on the same
    test bed left its pods' directories behind."""
    lines: list[dict[str, Any]] = []
    pods = (testbed.root / "local-pods" / "pods" / NAMESPACE).glob(f"{job}-g*-w0-*")
    pod_dirs = sorted((p for p in pods if p.stat().st_mtime >= since), key=lambda p: p.stat().st_mtime)
    for directory in pod_dirs:
        log = directory / "container.log"
        if log.exists():
            for raw in log.read_text(errors="replace").splitlines():
                if raw.startswith(PROGRESS_PREFIX):
                    lines.append(json.loads(raw[len(PROGRESS_PREFIX) :]))
    return lines


def prepare(testbed: Testbed, job: dict[str, Any]) -> None:
    """Local GPU nodes, the example GPU classes, the namespace, and no leftover job of the same name."""
    testbed.up(load_node_list(EXAMPLES / "demo" / "nodes.yaml"))
    testbed.kubectl("apply", "-f", str(EXAMPLES / "gpuclasses.yaml"))
    testbed.kubectl("create", "namespace", job["metadata"]["namespace"], check=False)
    name, namespace = job["metadata"]["name"], job["metadata"]["namespace"]
    testbed.kubectl("delete", "htj", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    # A fresh catalog: the job starts from the priors, as a first job of its workload does.
    testbed.kubectl("delete", "workloadprofiles", "--all", "--ignore-not-found")


@dataclass
class Followed:
    """A job followed to its end: its last state, its plans' splits by version, its epochs."""

    state: dict[str, Any]
    plans: dict[int, list[int]]
    rows: list[EpochRow]
    # When it was seen Running its first plan: its speeds are read at the latest of these at which
    # every rank has a series (a slow rank may not have been scraped at first, and the series go
    # stale one by one as the pods end).
    running_first_plan: list[float] = field(default_factory=list)


def follow(
    testbed: Testbed,
    job: dict[str, Any],
    console: Console,
    timeout_seconds: float,
    on_tick: Callable[[dict[str, Any]], None] | None = None,
) -> Followed:
    """Submit `job` and show it live until it ends (or the timeout)."""
    name = job["metadata"]["name"]
    submitted = time.time()
    testbed.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    plans: dict[int, list[int]] = {}
    started = time.monotonic()
    state: dict[str, Any] = {}
    running: list[float] = []
    with Live(console=console, refresh_per_second=2) as live:
        while time.monotonic() - started < timeout_seconds:
            state = _job(testbed, name)
            plan = (state.get("status") or {}).get("plan") or {}
            if (state.get("status") or {}).get("phase") == "Running" and plan.get("version") == 1:
                running.append(time.time())
            if plan.get("version"):
                plans[int(plan["version"])] = list(plan.get("localBatches") or [])
            if on_tick is not None:
                on_tick(state)
            rates = _worker_rates(testbed.prometheus_url, name)
            live.update(Panel(_view(state, rates, time.monotonic() - started), title="heterotrain demo"))
            if (state.get("status") or {}).get("phase") in TERMINAL:
                break
            time.sleep(1.0)
    return Followed(state, plans, epoch_rows(progress_lines(testbed, name, submitted), plans), running)


def baseline_jobs(job: dict[str, Any], epochs: int, fastest_class: str) -> dict[str, dict[str, Any]]:
    """What a user would run instead, each the same job on the same nodes with rebalancing off: the
    even split, the split the GPUClass priors give (the product's default without measurement), and
    the fastest GPU alone."""

    def variant(suffix: str, **spec: Any) -> dict[str, Any]:
        baseline = copy.deepcopy(job)
        baseline["metadata"]["name"] = f"{job['metadata']['name']}-{suffix}"
        baseline["spec"]["epochs"] = epochs
        split = spec.pop("initial_split")
        baseline["spec"]["rebalance"] = {
            **job["spec"].get("rebalance", {}),
            "enabled": False,
            "initialSplit": split,
        }
        baseline["spec"].update(spec)
        return baseline

    return {
        "even": variant("even", initial_split="even"),
        "prior": variant("prior", initial_split="prior"),
        "fastest_alone": variant(
            "fastest", initial_split="prior", gpus={"min": 1, "max": 1}, gpuClasses=[fastest_class]
        ),
    }


def fastest_class(testbed: Testbed, job: dict[str, Any]) -> str:
    """The job's GPU class with the highest relativeSpeed: the GPU a user would keep."""
    classes = json.loads(testbed.kubectl("get", "gpuclasses", "-o", "json").stdout)["items"]
    allowed = set(job["spec"].get("gpuClasses") or [])
    speeds = {c["metadata"]["name"]: float(c["spec"]["relativeSpeed"]) for c in classes}
    return max((name for name in speeds if not allowed or name in allowed), key=lambda name: speeds[name])


def first_plan_speeds(testbed: Testbed, followed: Followed, name: str) -> list[float]:
    """Each rank's samples/s of compute under the run's first plan (one Prometheus read per run)."""
    return measured_speeds(
        testbed.prometheus_url, name, followed.plans.get(1, []), followed.running_first_plan
    )


def by_node(followed: Followed, per_rank: Sequence[float]) -> dict[str, float]:
    """Per-rank figures of a run keyed by the node each rank ran on (its allocation)."""
    workers = ((followed.state.get("status") or {}).get("allocation") or {}).get("workers") or []
    nodes = {int(w["rank"]): str(w["node"]) for w in workers}
    return {nodes[rank]: value for rank, value in enumerate(per_rank) if rank in nodes}


def split_shares(followed: Followed) -> dict[str, float]:
    """Each node's share of the global batch under the run's first plan."""
    split = followed.plans.get(1, [])
    total = sum(split)
    return by_node(followed, [b / total for b in split]) if total else {}


def measured_speeds(
    prometheus: str, job: str, split: list[int], times: Sequence[float], version: int = 1
) -> list[float]:
    """Each rank's samples per second of compute under plan `version` (`split`), from Prometheus as it
    was at the latest of `times` at which every rank has a series; empty when no time has them all."""
    query = promql.mean_by_rank(names.STEP_COMPUTE_SECONDS, promql.selector(NAMESPACE, job, version))
    for at in reversed(times):
        params = {"query": query, "time": f"{at:.3f}"}
        body = httpx.get(f"{prometheus}/api/v1/query", params=params, timeout=10).json()
        compute = {int(r["metric"][names.LABEL_RANK]): float(r["value"][1]) for r in body["data"]["result"]}
        speeds = rank_speeds(split, compute)
        if speeds is not None:
            return speeds
    return []


def run_demo(
    settings: DemoSettings,
    console: Console,
    testbed: Testbed | None = None,
    job: dict[str, Any] | None = None,
    on_tick: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the job to the end (or the timeout) under a fresh operator, after its baselines (the same
    job with rebalancing off: even split, prior split, fastest GPU alone) when
    `settings.control_epochs`; `on_tick` sees every poll of the job."""
    owned = testbed is None
    testbed = testbed or Testbed(settings.root or cache_root() / "clusters" / "demo")
    output = settings.output
    output.mkdir(parents=True, exist_ok=True)
    job = job or demo_job()
    with console.status("starting the test bed (the first run builds it: minutes)"):
        prepare(testbed, job)
        fastest = fastest_class(testbed, job)
        baselines = baseline_jobs(job, settings.control_epochs, fastest) if settings.control_epochs else {}
        for baseline in baselines.values():
            prepare(testbed, baseline)
    console.print(f"test bed up: API server {testbed.apiserver_url}, Prometheus {testbed.prometheus_url}")
    report: dict[str, Any] = {}
    try:
        with operator_process(testbed, testbed.root / "logs" / "operator.log", settings.operator_kubeconfig):
            ran: dict[str, Followed] = {}
            for kind, baseline in baselines.items():
                console.print(f"baseline: the same job with rebalancing off, {kind.replace('_', ' ')}")
                ran[kind] = follow(testbed, baseline, console, settings.timeout_seconds)
            followed = follow(testbed, job, console, settings.timeout_seconds, on_tick)
            status = followed.state.get("status") or {}
            report = build_report(followed.rows, status.get("rebalances") or [])
            if ran:
                own = first_plan_speeds(testbed, followed, job["metadata"]["name"])
                speeds = {
                    k: first_plan_speeds(testbed, r, baselines[k]["metadata"]["name"]) for k, r in ran.items()
                }
                report["baselines"] = {
                    kind: baseline_comparison(
                        followed.rows,
                        run.rows,
                        by_node(run, speeds[kind]),
                        by_node(followed, own),
                        split_shares(run),
                    )
                    for kind, run in ran.items()
                }
                # The even baseline by rank, as the slowdown's recovery reads it.
                report["control"] = control_comparison(followed.rows, ran["even"].rows, speeds["even"], own)
            report.update(phase=status.get("phase"), status=status, prometheus=testbed.prometheus_url)
            (output / "report.json").write_text(json.dumps(report, indent=2))
            if followed.rows:
                plot(followed.rows, output / "throughput.png")
    finally:
        if owned and not settings.keep_cluster:
            testbed.down()
    return report


def _report_table(report: dict[str, Any]) -> Table:
    table = Table("epoch", "plan", "local batches", "samples/s", title="per epoch (measured by rank 0)")
    for row in report["per_epoch"]:
        table.add_row(
            str(row["epoch"]),
            f"v{row['plan_version']}",
            str(row["local_batches"]),
            f"{row['samples_per_second']:.0f}",
        )
    return table


def main(settings: DemoSettings | None = None) -> int:
    console = Console()
    settings = settings or DemoSettings()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    report = run_demo(settings, console)
    console.print(_report_table(report))
    for kind, compared in (report.get("baselines") or {}).items():
        if compared.get("speedup") and compared.get("ideal_speedup"):
            name, ideal = kind.replace("_", " "), compared["ideal_speedup"]
            console.print(
                f"against {name} (rebalancing off, same nodes): {compared['speedup']:.2f}x, "
                f"{compared['of_ideal']:.0%} of the {ideal:.2f}x the measured speeds allow"
            )
    speedup = report.get("speedup_vs_first_plan")
    accuracy = report.get("final_accuracy")
    console.print(
        f"phase {report.get('phase')}; speed-up over the job's first-plan epochs: "
        f"{speedup:.2f}x; final accuracy {accuracy:.3f}"
        if speedup and accuracy
        else f"phase {report.get('phase')}"
    )
    console.print(f"report: {settings.output / 'report.json'}, plot: {settings.output / 'throughput.png'}")
    console.print("dashboards: helm/heterotrain/dashboards/*.json (import into Grafana)")
    return 0 if report.get("phase") == "Succeeded" else 1
