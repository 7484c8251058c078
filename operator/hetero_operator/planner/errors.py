"""Errors raised by the planner when a problem has no answer."""

from __future__ import annotations


class PlanningError(ValueError):
    """The input is well formed but no plan satisfies it; the message names the limit that fails."""
