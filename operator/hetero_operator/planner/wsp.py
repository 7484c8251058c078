"""Wave Synchronous Parallel admission for pipelined virtual workers (HetPipe).

A wave is ``nm`` consecutive minibatches; a virtual worker pushes one aggregated update per wave,
and the parameter server's clock ``c_global`` is the number of waves every worker has pushed.
Minibatches are numbered from 1.
"""

from __future__ import annotations

from hetero_operator.planner.errors import PlanningError


def _check(nm: int, distance: int) -> None:
    if nm < 1:
        raise PlanningError("nm: must be at least 1")
    if distance < 0:
        raise PlanningError("distance: the clock-distance bound D must be >= 0")


def local_staleness(nm: int) -> int:
    """s_local = nm - 1."""
    _check(nm, 0)
    return nm - 1


def global_staleness(nm: int, distance: int) -> int:
    """s_global = (D + 1) * nm + (nm - 1) - 1: the most global updates a minibatch may miss."""
    _check(nm, distance)
    return (distance + 1) * nm + nm - 2


def required_global_clock(minibatch: int, nm: int, distance: int) -> int:
    """Waves every worker must have pushed before ``minibatch`` may start: max(0, p//nm - 1 - D)."""
    _check(nm, distance)
    if minibatch < 1:
        raise PlanningError("minibatch: numbering starts at 1")
    return max(0, minibatch // nm - 1 - distance)


def first_gated_minibatch(nm: int, distance: int) -> int:
    """The first minibatch that can wait on the global clock: (D + 2) * nm."""
    _check(nm, distance)
    return (distance + 2) * nm


def may_start(minibatch: int, nm: int, distance: int, completed: int, global_clock: int) -> bool:
    """The admission gate: may ``minibatch`` start now?

    ``completed`` is how many minibatches of this worker have completed with their update applied
    (they complete in order); ``global_clock`` is the parameter server's ``c_global``.
    Local rule: p <= nm or p - nm has completed. Global rule: c_global >= required clock.
    """
    if completed < 0 or global_clock < 0:
        raise PlanningError("completed and global_clock must be >= 0")
    local_ok = minibatch <= nm or completed >= minibatch - nm
    return local_ok and global_clock >= required_global_clock(minibatch, nm, distance)


def learning_rate_scale(virtual_workers: int) -> float:
    """Every virtual worker's wave update is added to the global weights: the step is scaled down by
    the number of virtual workers, so the combined step per clock stays close to one worker's."""
    if virtual_workers < 1:
        raise PlanningError("virtual_workers: at least one is needed")
    return 1.0 / virtual_workers
