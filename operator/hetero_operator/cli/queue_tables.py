"""`heterotrain describe queue NAME`: a HeteroQueue's quota, usage, share and jobs, as rich tables (pure)."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from hetero_operator.api.models import JobSummary
from hetero_operator.resources import HeteroQueue


def describe_queue(queue: HeteroQueue, jobs: Sequence[JobSummary]) -> Group:
    spec, status = queue.spec, queue.status
    header = Table(title=f"HeteroQueue {queue.name}", title_justify="left", show_header=False)
    header.add_column("field", style="bold")
    header.add_column("value", overflow="fold")
    header.add_row("weight", f"{spec.weight:g}")
    header.add_row("cohort", spec.cohort or "- (never borrows or lends)")
    if status is not None:
        header.add_row("share", f"{status.share:.4g} (lowest is served first)")
        header.add_row("charged usage", f"{status.charged_usage:.0f} reference-GPU seconds (decayed)")
        header.add_row("jobs", f"{status.running_jobs} running, {status.pending_jobs} pending")
        if status.message:
            header.add_row("problem", Text(status.message, style="red"))
    else:
        header.add_row("status", "not counted yet (is the operator running?)")
    quotas = Table(title="Quota and usage per GPU class", title_justify="left")
    for column in ("class", "held", "nominal", "borrowed", "borrowing limit", "lending limit"):
        quotas.add_column(column, justify="left" if column == "class" else "right")
    held = {u.gpu_class: u for u in (status.usage if status is not None else [])}
    listed = {q.gpu_class: q for q in spec.quotas}
    for gpu_class in sorted({*listed, *held}):
        quota, usage = listed.get(gpu_class), held.get(gpu_class)
        quotas.add_row(
            gpu_class,
            str(usage.gpus if usage else 0),
            str(quota.nominal if quota else 0),
            str(usage.borrowed if usage else 0),
            _limit(quota.borrowing_limit if quota else None),
            _limit(quota.lending_limit if quota else None),
        )
    parts: list[Table] = [header, quotas]
    if jobs:
        table = Table(title="Jobs", title_justify="left")
        for column in ("job", "phase", "priority", "gpus", "classes", "message"):
            table.add_column(column, overflow="fold")
        for job in sorted(jobs, key=lambda j: (j.namespace, j.name)):
            table.add_row(
                f"{job.namespace}/{job.name}",
                job.phase.value if job.phase else "-",
                str(job.priority if job.priority is not None else "-"),
                str(job.gpus),
                job.classes or "-",
                job.message,
            )
        parts.append(table)
    return Group(*parts)


def _limit(value: int | None) -> str:
    return "-" if value is None else str(value)
