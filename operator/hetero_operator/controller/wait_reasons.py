"""The scheduler's wait reasons in the job's status and back (pure): `status.waiting` carries them as
data, so `heterotrain describe` and the HTTP API show them without parsing a message."""

from __future__ import annotations

from hetero_operator.resources import ClassWait, NodeExclusion, Waiting
from hetero_operator.scheduler import ClassReason, ClassVerdict, WaitReason


def class_wait(reason: ClassReason) -> ClassWait:
    return ClassWait(
        gpu_class=reason.gpu_class,
        verdict=reason.verdict.value,
        free=reason.free,
        wanted=reason.wanted,
        held_back=reason.held_back,
        held_for=reason.held_for,
        held_for_queue=reason.held_for_queue,
        chunk=reason.chunk,
        nodes=reason.nodes,
        excluded=[NodeExclusion(filter=what, nodes=count) for what, count in reason.excluded],
    )


def waiting_of(reason: WaitReason) -> Waiting:
    return Waiting(reason=reason.code.value, classes=[class_wait(c) for c in reason.classes])


def class_reason(wait: ClassWait) -> ClassReason:
    """The status's record of one class, back in the scheduler's terms (to phrase it)."""
    return ClassReason(
        gpu_class=wait.gpu_class,
        verdict=ClassVerdict(wait.verdict),
        free=wait.free,
        wanted=wait.wanted,
        held_back=wait.held_back,
        held_for=wait.held_for,
        held_for_queue=wait.held_for_queue,
        chunk=wait.chunk,
        nodes=wait.nodes,
        excluded=tuple((e.filter, e.nodes) for e in wait.excluded),
    )
