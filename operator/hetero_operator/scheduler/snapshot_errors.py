"""The error every snapshot type raises for a malformed field (shared by `snapshot` and `queues`)."""

from __future__ import annotations


class SnapshotError(ValueError):
    """A snapshot field is malformed; the message names the field and how to fix it."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise SnapshotError(message)
