"""Rich tables for `heterotrain jobs`, `describe` and `whatif` (pure: models in, renderables out)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from hetero_operator.api.models import JobDetail, JobSummary, WhatIfResult
from hetero_operator.controller.wait_reasons import class_reason
from hetero_operator.resources import Allocation, ClassWait, Plan
from hetero_operator.scheduler.reasons import format_class

PHASE_STYLES = {
    "Running": "green",
    "Succeeded": "bold green",
    "Failed": "bold red",
    "Restarting": "yellow",
    "Queued": "cyan",
    "Starting": "blue",
    "Suspended": "dim",
}


def age(created: datetime | None, now: datetime | None = None) -> str:
    """kubectl-style age: 45s, 12m, 3h, 5d."""
    if created is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - created).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _phase(phase: str | None) -> Text:
    name = phase or "-"
    return Text(name, style=PHASE_STYLES.get(name, ""))


def jobs_table(jobs: Sequence[JobSummary], show_namespace: bool, now: datetime | None = None) -> Table:
    table = Table(title="HeteroTrainJobs", title_justify="left")
    if show_namespace:
        table.add_column("NAMESPACE")
    for column in ("NAME", "PHASE", "STRATEGY", "GPUS", "CLASSES", "EPOCH", "SAMPLES/S", "RESTARTS", "AGE"):
        table.add_column(column, justify="right" if column in {"GPUS", "SAMPLES/S", "RESTARTS"} else "left")
    table.add_column("MESSAGE", overflow="fold")
    for job in jobs:
        epochs = f"{job.epoch}/{job.epochs}" if job.epochs is not None else str(job.epoch)
        row: list[RenderableType] = [job.namespace] if show_namespace else []
        row += [
            job.name,
            _phase(job.phase.value if job.phase else None),
            job.strategy.value if job.strategy else "-",
            str(job.gpus),
            job.classes or "-",
            epochs,
            _number(job.samples_per_second),
            str(job.restarts),
            age(job.created, now),
            job.message,
        ]
        table.add_row(*row)
    return table


def allocation_table(allocation: Allocation, plan: Plan | None, title: str = "Allocation") -> Table:
    """One row per worker, with its local batch when a plan covers every rank."""
    batches = (
        plan.local_batches
        if plan is not None and len(plan.local_batches) == len(allocation.workers)
        else None
    )
    table = Table(title=f"{title} (generation {allocation.generation})", title_justify="left")
    for column in ("RANK", "NODE", "GPU CLASS", "GPUS", "VIRTUAL WORKER", "STAGE", "LOCAL BATCH"):
        table.add_column(column)
    for worker in allocation.workers:
        table.add_row(
            str(worker.rank),
            worker.node,
            worker.gpu_class,
            str(worker.gpus),
            "-" if worker.virtual_worker is None else str(worker.virtual_worker),
            "-" if worker.stage is None else str(worker.stage),
            "-" if batches is None else str(batches[worker.rank]),
        )
    return table


def plan_table(plan: Plan, samples_per_second: float | None = None) -> Table:
    table = Table(title="Plan and throughput", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    table.add_row("version", str(plan.version))
    table.add_row("applies from epoch", str(plan.epoch))
    table.add_row("global batch", str(plan.global_batch))
    table.add_row("local batches", ", ".join(str(b) for b in plan.local_batches))
    table.add_row("predicted iteration (s)", _number(plan.predicted_iteration_seconds, 4))
    table.add_row("measured iteration (s)", _number(plan.measured_iteration_seconds, 4))
    if samples_per_second is not None:
        table.add_row("samples/s", _number(samples_per_second))
    return table


def history_table(job: JobDetail) -> Table:
    table = Table(title="Rebalance history", title_justify="left")
    for column in ("TIME", "EPOCH", "PLAN", "PREDICTED GAIN", "PREDICTED (s)", "MEASURED (s)", "REASON"):
        table.add_column(column)
    for record in job.rebalances:
        table.add_row(
            record.time.strftime("%Y-%m-%d %H:%M:%S"),
            str(record.epoch),
            f"{record.from_version} -> {record.to_version}",
            f"{record.predicted_gain:+.1%}",
            _number(record.predicted_iteration_seconds, 4),
            _number(record.measured_iteration_seconds, 4),
            record.reason,
        )
    return table


def conditions_table(job: JobDetail) -> Table:
    table = Table(title="Conditions", title_justify="left")
    for column in ("TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"):
        table.add_column(column, overflow="fold" if column == "MESSAGE" else "ellipsis")
    for condition in job.conditions:
        table.add_row(
            condition.type,
            condition.status.value,
            condition.reason,
            condition.last_transition_time.strftime("%Y-%m-%d %H:%M:%S"),
            condition.message,
        )
    return table


def class_table(rows: Sequence[tuple[ClassWait, str]], title: str = "Per GPU class") -> Table:
    """Why a job waits, one GPU class per row: the scheduler's numbers and its phrase."""
    table = Table(title=title, title_justify="left")
    for column in ("GPU CLASS", "VERDICT", "FREE", "NEEDS", "HELD BACK", "WHY NOT"):
        table.add_column(column, overflow="fold" if column == "WHY NOT" else "ellipsis")
    for wait, phrase in rows:
        table.add_row(
            wait.gpu_class,
            wait.verdict,
            str(wait.free),
            str(wait.wanted or "-"),
            f"{wait.held_back} for {wait.held_for}" if wait.held_back else "-",
            phrase.removeprefix(f"class {wait.gpu_class}: "),
        )
    return table


def describe_job(job: JobDetail, now: datetime | None = None) -> Group:
    header = Table(
        title=f"HeteroTrainJob {job.namespace}/{job.name}", title_justify="left", show_header=False
    )
    header.add_column("field", style="bold")
    header.add_column("value", overflow="fold")
    header.add_row("phase", _phase(job.phase.value if job.phase else None))
    header.add_row("strategy", job.strategy.value if job.strategy else "-")
    header.add_row(
        "queue / priority", f"{job.queue or '-'} / {job.priority if job.priority is not None else '-'}"
    )
    header.add_row("gpus (min-max)", f"{job.gpus_min or '-'}-{job.gpus_max or '-'}, holding {job.gpus}")
    header.add_row("gpu classes", ", ".join(job.gpu_classes) or "any")
    header.add_row("epoch", f"{job.epoch}/{job.epochs}" if job.epochs else str(job.epoch))
    header.add_row("samples/s", _number(job.samples_per_second))
    eta = job.progress.eta_seconds if job.progress is not None else None
    header.add_row("eta (s)", _number(eta, 0))
    header.add_row("restarts", str(job.restarts))
    header.add_row("age", age(job.created, now))
    if job.message:
        header.add_row("message", job.message)
    for problem in job.problems:
        header.add_row("problem", Text(problem, style="red"))
    parts: list[RenderableType] = [header]
    if job.allocation is not None and job.allocation.workers:
        parts.append(allocation_table(job.allocation, job.plan))
    if job.plan is not None:
        parts.append(plan_table(job.plan, job.samples_per_second))
    if job.waiting is not None and job.waiting.classes:
        rows = [(w, format_class(class_reason(w))) for w in job.waiting.classes]
        parts.append(class_table(rows, title=f"Waiting ({job.waiting.reason}), per GPU class"))
    parts.append(history_table(job))
    parts.append(conditions_table(job))
    return Group(*parts)


def what_if_view(result: WhatIfResult) -> Group:
    summary = Table(title=f"What-if against the {result.pool} pool", title_justify="left", show_header=False)
    summary.add_column("field", style="bold")
    summary.add_column("value", overflow="fold")
    verdict = (
        Text("would be placed now", style="green") if result.schedulable else Text("would wait", style="red")
    )
    summary.add_row("verdict", verdict)
    summary.add_row("predicted samples/s", _number(result.predicted_samples_per_second))
    summary.add_row("predicted iteration (s)", _number(result.predicted_iteration_seconds, 4))
    if result.allocation is not None:
        summary.add_row("gpus", f"{result.allocation.total_gpus} ({result.allocation.classes})")
    if result.would_preempt:
        summary.add_row("would push aside", ", ".join(result.would_preempt))
    if result.message:
        summary.add_row("scheduler says", result.message)
    parts: list[RenderableType] = [summary]
    if result.allocation is not None and result.allocation.workers:
        parts.append(allocation_table(result.allocation, result.plan, title="Placement"))
    if result.class_reasons:
        parts.append(class_table([(reason, reason.reason) for reason in result.class_reasons]))
    return Group(*parts)
