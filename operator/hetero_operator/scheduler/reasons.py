"""Why a job waits, class by class, as data; formatted into a sentence only at the edge.

In the style of Kueue's flavor assigner: the cycle records a `WaitReason` (a code for the `Placed`
condition's reason, plus one `ClassReason` per GPU class), and `format_wait` turns it into the
message a user reads, e.g. "needs 4 GPUs at once (gpus.min); class a100: 2 of 4 GPUs free; class t4:
not allowed by spec.gpuClasses". Every GPUClass in the snapshot is named, plus any class the job asks
for that does not exist, so a user can see at a glance what would have to change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from hetero_operator.scheduler.placement import PlacementContext
from hetero_operator.scheduler.reservations import NO_LIMIT, Budgets
from hetero_operator.scheduler.snapshot import JobRequest


class WaitCode(StrEnum):
    """The main reason a job is not placed (the `Placed=False` condition's reason)."""

    NO_VALID_SIZE = "NoValidSize"  # no worker count in [gpus.min, gpus.max] fits its grouping
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"  # its classes could never hold it
    WAITING_FOR_GPUS = "WaitingForGPUs"  # not enough free GPUs now
    NO_FITTING_LAYOUT = "NoFittingLayout"  # enough GPUs free, but no placement of them fits
    PREEMPTING = "Preempting"  # lower-priority jobs are saving a checkpoint to make room
    RECLAIMING_GROWTH = "ReclaimingGrownGPUs"  # jobs that grew give back GPUs of a much faster class
    QUEUED_BEHIND_HEAD = "QueuedBehindHead"  # an earlier job of its queue goes first
    UNKNOWN_QUEUE = "UnknownQueue"  # spec.queue names no queue while queues are in use
    QUOTA_EXCEEDED = "QuotaExceeded"  # its queue's quota (with what its cohort lends) is too small now


class ClassVerdict(StrEnum):
    UNKNOWN = "UnknownClass"
    NOT_ALLOWED = "NotAllowed"
    NO_SCHEDULABLE_NODES = "NoSchedulableNodes"
    SHORT = "NotEnoughFree"


@dataclass(frozen=True, slots=True)
class ClassReason:
    """What one GPU class offers the waiting job. ``excluded``: (filter, nodes) for the class's nodes
    that no new worker may use, e.g. ("taint kwok.x-k8s.io/node=fake:NoSchedule not tolerated", 3)."""

    gpu_class: str
    verdict: ClassVerdict
    free: int = 0
    wanted: int = 0
    held_back: int = 0
    held_for: str | None = None
    held_for_queue: str | None = None
    chunk: int = 1
    nodes: int = 0
    excluded: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class WaitReason:
    """Everything a user needs to see why a job waits."""

    code: WaitCode
    want: int | None
    classes: tuple[ClassReason, ...] = ()
    gpus_min: int = 1
    gpus_max: int = 1
    chunk: int = 1
    capacity: int | None = None  # schedulable GPUs of its classes, when they can never hold it
    layout_policy: str | None = None  # set when GPUs are free but no layout fits
    preempting: tuple[str, ...] = ()
    behind: str | None = None
    queue: str = "default"
    note: str | None = None  # a whole sentence, for policies that record no per-class detail
    # GPUs the job's queue may still take per allowed class, when its quota holds it back.
    quota_room: tuple[tuple[str, int], ...] = ()
    reclaiming: bool = False
    # (class, times as fast as on the GPUs free now) when grown jobs give that class's GPUs back.
    faster_on: tuple[str, float] | None = None

    @property
    def message(self) -> str:
        return format_wait(self)


@dataclass(frozen=True, slots=True)
class WaitContext:
    """Circumstances beyond free GPUs that explain the wait."""

    want: int | None
    impossible: bool = False
    behind: str | None = None  # the head of the job's queue it waits behind
    preempting: tuple[str, ...] = ()
    enough_free_but_no_layout: bool = False
    reclaiming: bool = False  # the preempted jobs borrowed quota the job's queue owns
    faster_on: tuple[str, float] | None = None  # the shrunk jobs grew into this class, this much faster


def class_reasons(job: JobRequest, want: int, ctx: PlacementContext, budgets: Budgets) -> list[ClassReason]:
    """One entry per class: allowed ones in the job's preference order first, then the rest."""
    state = ctx.state
    known = state.classes
    preferred = list(job.allowed_classes)
    others = sorted(c for c in known if c not in preferred)
    reasons: list[ClassReason] = []
    for gpu_class in [*preferred, *others]:
        if gpu_class not in known:
            reasons.append(ClassReason(gpu_class, ClassVerdict.UNKNOWN))
        elif not job.allows(gpu_class):
            reasons.append(ClassReason(gpu_class, ClassVerdict.NOT_ALLOWED))
        elif state.capacity[gpu_class] == 0:
            reasons.append(
                ClassReason(
                    gpu_class,
                    ClassVerdict.NO_SCHEDULABLE_NODES,
                    nodes=state.node_count[gpu_class],
                    excluded=tuple(sorted(state.excluded[gpu_class].items())),
                )
            )
        else:
            reasons.append(_free_reason(job, gpu_class, want, ctx, budgets))
    return reasons


def _free_reason(
    job: JobRequest, gpu_class: str, want: int, ctx: PlacementContext, budgets: Budgets
) -> ClassReason:
    free = ctx.state.free[gpu_class].usable(job.chunk)
    room = budgets.room(gpu_class)
    held, head = 0, None
    if room < free:
        held = free - max(room, 0)
        head = budgets.limiting_head(gpu_class)
    return ClassReason(
        gpu_class,
        ClassVerdict.SHORT,
        free=free,
        wanted=want,
        held_back=held,
        held_for=head.job if head is not None else None,
        held_for_queue=head.queue if head is not None else None,
        chunk=job.chunk,
        nodes=ctx.state.node_count[gpu_class],
        excluded=tuple(sorted(ctx.state.excluded[gpu_class].items())),
    )


def explain(job: JobRequest, wait: WaitContext, ctx: PlacementContext, budgets: Budgets) -> WaitReason:
    """The reason a job is not placed in this cycle."""
    shape = WaitReason(
        WaitCode.NO_VALID_SIZE,
        None,
        gpus_min=job.gpus_min,
        gpus_max=job.gpus_max,
        chunk=job.chunk,
        queue=job.queue,
    )
    if wait.want is None:
        return shape
    capacity = None
    if wait.impossible:
        code = WaitCode.INSUFFICIENT_CAPACITY
        capacity = sum(ctx.state.capacity[c] for c in ctx.state.classes if job.allows(c))
    elif wait.behind is not None:
        code = WaitCode.QUEUED_BEHIND_HEAD
    elif wait.faster_on is not None:
        code = WaitCode.RECLAIMING_GROWTH
    elif wait.preempting:
        code = WaitCode.PREEMPTING
    elif wait.enough_free_but_no_layout:
        code = WaitCode.NO_FITTING_LAYOUT
    else:
        code = WaitCode.WAITING_FOR_GPUS
    return replace(
        shape,
        code=code,
        want=wait.want,
        classes=tuple(class_reasons(job, wait.want, ctx, budgets)),
        capacity=capacity,
        layout_policy=job.allocation_policy.value if wait.enough_free_but_no_layout else None,
        preempting=wait.preempting,
        behind=wait.behind,
        reclaiming=wait.reclaiming,
        faster_on=wait.faster_on,
    )


def unknown_queue(job: JobRequest) -> WaitReason:
    return WaitReason(
        WaitCode.UNKNOWN_QUEUE, None, gpus_min=job.gpus_min, gpus_max=job.gpus_max, queue=job.queue
    )


def over_quota(
    job: JobRequest, want: int, room: dict[str, int], reclaiming: tuple[str, ...] = ()
) -> WaitReason:
    """The job's queue may not take ``want`` GPUs of its classes now; ``reclaiming``: jobs of other
    queues that borrowed its quota and are being checkpointed and stopped."""
    return WaitReason(
        WaitCode.PREEMPTING if reclaiming else WaitCode.QUOTA_EXCEEDED,
        want,
        gpus_min=job.gpus_min,
        gpus_max=job.gpus_max,
        chunk=job.chunk,
        queue=job.queue,
        preempting=reclaiming,
        quota_room=tuple(sorted(room.items())),
        reclaiming=bool(reclaiming),
    )


# --- the edge: sentences ---------------------------------------------------------------------------


def format_class(reason: ClassReason) -> str:
    """One class's phrase, e.g. "class fast: 2 of 4 GPUs free, 1 of them held back for ns/big, ..."."""
    name = reason.gpu_class
    if reason.verdict is ClassVerdict.UNKNOWN:
        return f"class {name}: no GPUClass of that name"
    if reason.verdict is ClassVerdict.NOT_ALLOWED:
        return f"class {name}: not allowed by spec.gpuClasses"
    if reason.verdict is ClassVerdict.NO_SCHEDULABLE_NODES:
        return f"class {name}: no schedulable nodes ({_nodes_phrase(reason)})"
    line = f"class {name}: {reason.free} of {_gpus(reason.wanted)} free"
    if reason.held_back:
        owner = (
            f" for {reason.held_for}, the head of queue {reason.held_for_queue}"
            if reason.held_for is not None
            else ""
        )
        line += f", {reason.held_back} of them held back{owner}"
    if reason.chunk > 1:
        line += f" in whole virtual workers of {reason.chunk}"
    if reason.excluded:
        line += f", {_exclusions(reason)}"
    return line


def _nodes_phrase(reason: ClassReason) -> str:
    if reason.nodes == 0:
        return "no node matches its nodeSelector"
    return _exclusions(reason)


def _exclusions(reason: ClassReason) -> str:
    """ "3 of 4 nodes excluded: 2 not Ready, 1 cordoned"; a taint names what would let the job in."""
    excluded = sum(count for _, count in reason.excluded)
    parts = [f"{count} {what}" for what, count in reason.excluded]
    text = f"{excluded} of {_count(reason.nodes, 'node')} excluded: {', '.join(parts)}"
    if any(what.startswith("taint ") for what, _ in reason.excluded):
        text += " (tolerate it in the GPUClass's spec.tolerations)"
    return text


def format_wait(reason: WaitReason) -> str:
    """The full message for a job that is not placed in this cycle."""
    if reason.note is not None:
        return reason.note
    if reason.code is WaitCode.UNKNOWN_QUEUE:
        return (
            f"spec.queue: no HeteroQueue named {reason.queue!r}; create it, or name an existing "
            "HeteroQueue (kubectl get heteroqueues)"
        )
    if reason.want is None:
        return (
            f"no multiple of parallelism.hetpipe.virtualWorkerSize ({reason.chunk}) lies between gpus.min "
            f"({reason.gpus_min}) and gpus.max ({reason.gpus_max}): change one of them"
        )
    rounded = " rounded up to whole virtual workers" if reason.want != reason.gpus_min else ""
    parts = [f"needs {_gpus(reason.want)} at once (gpus.min{rounded})"]
    parts += [format_class(c) for c in reason.classes]
    if reason.quota_room:
        room = ", ".join(
            f"class {c}: {'no limit' if n >= NO_LIMIT else _gpus(n)}" for c, n in reason.quota_room
        )
        parts.append(
            f"queue {reason.queue} may take only {room} more (its nominal quota plus what its cohort lends)"
        )
    if reason.capacity is not None:
        parts.append(
            f"the allowed classes have {reason.capacity} schedulable GPUs in total, so the job cannot start "
            "until GPU nodes are added, spec.gpuClasses is widened or gpus.min is lowered"
        )
    if reason.layout_policy is not None:
        parts.append(
            "enough GPUs are free but no placement of them fits the job (virtual-worker grouping "
            f"{reason.layout_policy} or per-class batch limits)"
        )
    if reason.preempting and reason.reclaiming:
        parts.append(
            f"queue {reason.queue} reclaims the GPUs of its quota that other queues borrowed, "
            f"checkpointing and stopping: {', '.join(reason.preempting)}"
        )
    elif reason.faster_on is not None:
        gpu_class, times = reason.faster_on
        giving = f": {', '.join(reason.preempting)}" if reason.preempting else ""
        parts.append(
            f"waiting for {gpu_class} GPUs that jobs grew into while they sat idle, being handed back "
            f"(checkpoint, then shrink toward gpus.min){giving}; on {gpu_class} it runs {times:.1f}x "
            "as fast as on the GPUs free now"
        )
    elif reason.preempting:
        parts.append(
            f"making room by checkpointing and stopping lower-priority jobs: {', '.join(reason.preempting)}"
        )
    if reason.behind is not None:
        parts.append(f"queued behind {reason.behind}, the head of queue {reason.queue}")
    return "; ".join(parts)


def _gpus(count: int) -> str:
    return _count(count, "GPU")


def _count(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
