"""Progress lines a worker prints on stdout for its supervisor (run-local) to display."""

from __future__ import annotations

import json
import sys
from typing import Any

from hetero_operator.plan import PROGRESS_PREFIX

__all__ = ["PROGRESS_PREFIX", "emit_progress", "parse_progress"]


def emit_progress(payload: dict[str, Any]) -> None:
    sys.stdout.write(PROGRESS_PREFIX + json.dumps(payload) + "\n")
    sys.stdout.flush()


def parse_progress(line: str) -> dict[str, Any] | None:
    """The payload of a progress line, or None for any other line."""
    if not line.startswith(PROGRESS_PREFIX):
        return None
    payload: dict[str, Any] = json.loads(line[len(PROGRESS_PREFIX) :])
    return payload
