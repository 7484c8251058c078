"""Why a job waits, class by class, in the style of Kueue's flavor-assignment messages.

Example: "needs 4 GPUs at once (gpus.min); class a100: 2 of 4 GPUs free; class t4: not allowed by
spec.gpuClasses". Every GPUClass in the snapshot is named, plus any class the job asks for that
does not exist, so a user can see at a glance what would have to change.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetero_operator.scheduler.placement import PlacementContext
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import JobRequest


@dataclass(frozen=True, slots=True)
class WaitContext:
    """Circumstances beyond free GPUs that explain the wait."""

    want: int | None
    impossible: bool = False
    behind: str | None = None  # the head of the job's queue it waits behind
    preempting: tuple[str, ...] = ()
    enough_free_but_no_layout: bool = False


def class_lines(job: JobRequest, want: int, ctx: PlacementContext, budgets: Budgets) -> list[str]:
    """One phrase per class: allowed ones in the job's preference order first, then the rest."""
    state = ctx.state
    known = state.classes
    preferred = list(job.allowed_classes)
    others = sorted(c for c in known if c not in preferred)
    lines: list[str] = []
    for gpu_class in [*preferred, *others]:
        if gpu_class not in known:
            lines.append(f"class {gpu_class}: no GPUClass of that name")
        elif not job.allows(gpu_class):
            lines.append(f"class {gpu_class}: not allowed by spec.gpuClasses")
        elif state.capacity[gpu_class] == 0:
            lines.append(f"class {gpu_class}: no schedulable nodes")
        else:
            lines.append(_free_line(job, gpu_class, want, ctx, budgets))
    return lines


def _free_line(job: JobRequest, gpu_class: str, want: int, ctx: PlacementContext, budgets: Budgets) -> str:
    free = ctx.state.free[gpu_class].usable(job.chunk)
    line = f"class {gpu_class}: {free} of {_gpus(want)} free"
    room = budgets.room(gpu_class)
    if room < free:
        held = free - max(room, 0)
        head = budgets.limiting_head(gpu_class)
        owner = f" for {head.job}, the head of queue {head.queue}" if head is not None else ""
        line += f", {held} of them held back{owner}"
    if job.chunk > 1:
        line += f" in whole virtual workers of {job.chunk}"
    return line


def explain(job: JobRequest, wait: WaitContext, ctx: PlacementContext, budgets: Budgets) -> str:
    """The full message for a job that is not placed in this cycle."""
    if wait.want is None:
        return (
            f"no multiple of parallelism.hetpipe.virtualWorkerSize ({job.chunk}) lies between gpus.min "
            f"({job.gpus_min}) and gpus.max ({job.gpus_max}): change one of them"
        )
    rounded = " rounded up to whole virtual workers" if wait.want != job.gpus_min else ""
    parts = [f"needs {_gpus(wait.want)} at once (gpus.min{rounded})"]
    parts += class_lines(job, wait.want, ctx, budgets)
    if wait.impossible:
        capacity = sum(ctx.state.capacity[c] for c in ctx.state.classes if job.allows(c))
        parts.append(
            f"the allowed classes have {capacity} schedulable GPUs in total, so the job cannot start until "
            "GPU nodes are added, spec.gpuClasses is widened or gpus.min is lowered"
        )
    if wait.enough_free_but_no_layout:
        parts.append(
            "enough GPUs are free but no placement of them fits the job (virtual-worker grouping "
            f"{job.allocation_policy.value} or per-class batch limits)"
        )
    if wait.preempting:
        parts.append(
            f"making room by checkpointing and stopping lower-priority jobs: {', '.join(wait.preempting)}"
        )
    if wait.behind is not None:
        parts.append(f"queued behind {wait.behind}, the head of queue {job.queue}")
    return "; ".join(parts)


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
