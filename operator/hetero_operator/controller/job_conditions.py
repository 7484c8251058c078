"""Builders of a job's conditions, shared by every writer of its status (pure).

A condition's transition time moves only when its truth changes, and setting an identical condition
leaves the status untouched, so a writer that sets the same thing twice writes nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum

from hetero_operator.resources import Condition, ConditionStatus, HeteroTrainJobStatus
from hetero_operator.resources.job_status import MAX_MESSAGE_LENGTH


class ConditionType(StrEnum):
    VALID = "Valid"
    PLACED = "Placed"
    PODS_READY = "PodsReady"
    DRAINING = "Draining"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    METRICS_AVAILABLE = "MetricsAvailable"  # the rebalancer's
    ADMITTED = "Admitted"  # a job submitted to Kueue: its Workload's state, and what waits on what


# Condition types the rebalancer writes; every other type belongs to the scheduling loop.
REBALANCER_TYPES = frozenset({ConditionType.METRICS_AVAILABLE.value})


def condition_time(now: float) -> datetime:
    return datetime.fromtimestamp(now, UTC).replace(microsecond=0)


def condition(status: HeteroTrainJobStatus, kind: ConditionType) -> Condition | None:
    return next((c for c in status.conditions if c.type == kind.value), None)


def is_true(status: HeteroTrainJobStatus, kind: ConditionType) -> bool:
    found = condition(status, kind)
    return found is not None and found.status is ConditionStatus.TRUE


def set_condition(
    status: HeteroTrainJobStatus,
    kind: ConditionType,
    value: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None = None,
) -> HeteroTrainJobStatus:
    """Set a condition; its transition time moves only when its truth changes, and an identical
    condition leaves the status untouched (no write)."""
    wanted = ConditionStatus.TRUE if value else ConditionStatus.FALSE
    message = message[:MAX_MESSAGE_LENGTH]
    found = condition(status, kind)
    if (
        found is not None
        and found.status is wanted
        and found.reason == reason
        and found.message == message
        and (generation is None or found.observed_generation == generation)
    ):
        return status
    since = (
        found.last_transition_time if found is not None and found.status is wanted else condition_time(now)
    )
    updated = Condition(
        type=kind.value,
        status=wanted,
        reason=reason,
        message=message,
        last_transition_time=since,
        observed_generation=generation,
    )
    return status.with_condition(updated)


def clear_condition(
    status: HeteroTrainJobStatus, kind: ConditionType, reason: str, message: str, now: float
) -> HeteroTrainJobStatus:
    """Set a condition False if it is there at all."""
    if condition(status, kind) is None:
        return status
    return set_condition(status, kind, False, reason, message, now)
