"""Jobs a quota system has admitted on an exact number of GPUs per class (a Kueue Workload's pod set
counts): placed on exactly those GPUs or left waiting, never on fewer, more or other GPUs.

The quota system decided how many GPUs of each class the job may use; this cycle only chooses the
nodes (fewest first, as for every placement) and lays the workers out. The job may still wait for
its nodes: a job that was just evicted may be saving a checkpoint on them, or GPUs may be taken by
pods the quota system does not count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hetero_operator.scheduler.free_index import NodeTake
from hetero_operator.scheduler.placement import PlacementContext, rebuild_allocation
from hetero_operator.scheduler.reasons import ClassReason, ClassVerdict, WaitCode, WaitReason
from hetero_operator.scheduler.reservations import Budgets
from hetero_operator.scheduler.snapshot import Allocation, JobRequest
from hetero_operator.scheduler.throughput import Prediction


@dataclass(frozen=True, slots=True)
class AdmittedPlacement:
    allocation: Allocation
    prediction: Prediction


def mix_text(mix: dict[str, int]) -> str:
    """ "fast: 2, slow: 1" (classes by name)."""
    return ", ".join(f"{gpu_class}: {count}" for gpu_class, count in sorted(mix.items()))


def place_admitted(
    job: JobRequest, ctx: PlacementContext, budgets: Budgets
) -> AdmittedPlacement | WaitReason:
    """Place `job` on exactly `job.exact_mix` (GPUs per class) and commit it to the cycle's state,
    or say which class lacks free GPUs."""
    assert job.exact_mix is not None
    mix = dict(job.exact_mix)
    state = ctx.state
    takes: list[NodeTake] = []
    short: list[ClassReason] = []
    for gpu_class, count in sorted(mix.items()):
        if gpu_class not in state.classes:
            short.append(ClassReason(gpu_class, ClassVerdict.UNKNOWN, wanted=count))
            continue
        index = state.free[gpu_class]
        picks = index.plan(count, job.chunk) if budgets.room(gpu_class) >= count else None
        if picks is None:
            short.append(_short(job, gpu_class, count, ctx, budgets))
            continue
        takes.extend(picks)
    admitted = f"admitted on {mix_text(mix)} GPUs"
    if short:
        phrases = "; ".join(_phrase(reason) for reason in short)
        return _waiting(job, WaitCode.WAITING_FOR_GPUS, tuple(short), f"{admitted}; waiting for {phrases}")
    per_node: Counter[str] = Counter()
    for node, count in takes:
        per_node[node] += count
    candidate = rebuild_allocation(job, per_node, ctx)
    if candidate is None:
        note = f"{admitted}, but no layout of the job fits them (virtual-worker grouping or batch limits)"
        return _waiting(job, WaitCode.NO_FITTING_LAYOUT, (), note)
    state.commit(job.key, takes)
    for gpu_class, count in mix.items():
        budgets.commit(gpu_class, count)
    return AdmittedPlacement(candidate.allocation, candidate.prediction)


def _short(
    job: JobRequest, gpu_class: str, count: int, ctx: PlacementContext, budgets: Budgets
) -> ClassReason:
    state = ctx.state
    free = state.free[gpu_class].usable(job.chunk)
    room = budgets.room(gpu_class)
    head = budgets.limiting_head(gpu_class) if room < min(free, count) else None
    return ClassReason(
        gpu_class,
        ClassVerdict.SHORT if state.capacity[gpu_class] else ClassVerdict.NO_SCHEDULABLE_NODES,
        free=free,
        wanted=count,
        held_back=max(0, free - max(room, 0)) if head is not None else 0,
        held_for=head.job if head is not None else None,
        held_for_queue=head.queue if head is not None else None,
        chunk=job.chunk,
        nodes=state.node_count[gpu_class],
        excluded=tuple(sorted(state.excluded[gpu_class].items())),
    )


def _phrase(reason: ClassReason) -> str:
    if reason.verdict is ClassVerdict.UNKNOWN:
        return f"class {reason.gpu_class}, which has no GPUClass"
    text = f"{reason.wanted} GPUs of class {reason.gpu_class} ({reason.free} free"
    if reason.held_for is not None:
        text += f", {reason.held_back} held back for {reason.held_for}"
    return text + ")"


def _waiting(job: JobRequest, code: WaitCode, classes: tuple[ClassReason, ...], note: str) -> WaitReason:
    return WaitReason(
        code,
        sum((job.exact_mix or {}).values()),
        classes=classes,
        gpus_min=job.gpus_min,
        gpus_max=job.gpus_max,
        chunk=job.chunk,
        queue=job.queue,
        note=note,
    )
