"""The divergence guard: a job whose ranks stop agreeing, or whose numbers stop being numbers, ends
at once, naming the ranks and the step; it never trains on silently and never ends as if it had
succeeded.

- **Replicas compare.** Where every rank should hold the same model (the `data` strategy after every
  step; every strategy at an epoch's end, after its averaging), the ranks exchange a checksum of their
  parameters (the sum and the sum of squares, in float64): after the first step, every
  `HETEROTRAIN_CHECK_EVERY_STEPS` steps (default 50; 0 checks at epoch ends only) and at every epoch
  end. Ranks more than a relative `REPLICA_TOLERANCE` apart have diverged.
- **Numbers stay finite.** A non-finite loss on a step the optimizer took, a non-finite parameter, or
  a loss scale that has collapsed (more than `MAX_SKIPPED_IN_A_ROW` overflowing steps in a row) ends
  the job. A step that the loss scaler skipped for an overflow is not an error: it did not move the
  model.

Every rank reaches the verdict at the same collective, so every rank ends the same way: it logs the
verdict, writes it as its container's termination message (which the operator shows in the job's
conditions and events) and exits with `DIVERGED_EXIT_CODE`, which the operator never restarts.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn

from hetero_operator.plan import CHECK_EVERY_STEPS_ENV, DIVERGED_EXIT_CODE, TERMINATION_LOG_ENV

log = logging.getLogger(__name__)

DEFAULT_CHECK_EVERY_STEPS = 50
REPLICA_TOLERANCE = 1e-5
"""Relative distance between two ranks' checksums above which they have diverged. Ranks that apply the
same synchronised gradient with the same optimizer on the same kind of device are bit-identical; a
job that mixes CPU and GPU ranks may differ in the last bits of an optimizer's arithmetic."""
MAX_SKIPPED_IN_A_ROW = 30
"""Overflowing steps in a row after which the loss scale (halved at each) has collapsed: 2^16 / 2^30."""
DEFAULT_TERMINATION_LOG = Path("/dev/termination-log")


class Diverged(RuntimeError):
    """What the guard found; `message` names the ranks and the step."""


@dataclass(frozen=True)
class Checksum:
    """One rank's view of its model, as the ranks exchange it."""

    total: float  # Σ p
    squares: float  # Σ p²
    magnitude: float  # Σ |p|
    bad_step: int  # the first step at which this rank saw a non-finite loss on a taken step, or -1

    def as_list(self) -> list[float]:
        return [self.total, self.squares, self.magnitude, float(self.bad_step)]


def checksum(params: Sequence[torch.Tensor], bad_step: int = -1) -> Checksum:
    """Float64 sums over the parameters, one parameter at a time (no copy of the model)."""
    total = squares = magnitude = 0.0
    with torch.no_grad():
        sums = [
            torch.stack(
                [p.sum(dtype=torch.float64), p.double().square().sum(), p.abs().sum(dtype=torch.float64)]
            )
            for p in params
        ]
    if sums:
        total, squares, magnitude = (float(x) for x in torch.stack(sums).sum(dim=0).tolist())
    return Checksum(total, squares, magnitude, bad_step)


def _apart(a: float, b: float, scale: float) -> bool:
    return abs(a - b) > REPLICA_TOLERANCE * max(scale, 1e-30)


def verdict(checksums: Sequence[Checksum], where: str, compare: bool) -> str | None:
    """Why the ranks' checksums end the job, naming the ranks, or None (pure)."""
    bad = [(rank, c.bad_step) for rank, c in enumerate(checksums) if c.bad_step >= 0]
    if bad:
        first = min(step for _, step in bad)
        ranks = ", ".join(str(rank) for rank, _ in bad)
        return f"non-finite loss on rank {ranks} (first at step {first}), {where}"
    nonfinite = [r for r, c in enumerate(checksums) if not all(map(math.isfinite, c.as_list()))]
    if nonfinite:
        return f"non-finite parameters on rank {', '.join(map(str, nonfinite))}, {where}"
    if not compare:
        return None
    reference = checksums[0]
    apart = [
        rank
        for rank, c in enumerate(checksums)
        if _apart(c.total, reference.total, reference.magnitude)
        or _apart(c.squares, reference.squares, reference.squares)
    ]
    if not apart:
        return None
    return (
        f"the parameters of rank {', '.join(map(str, apart))} differ from rank 0's {where} "
        f"(sums {', '.join(f'{c.total:.9g}' for c in checksums)} by rank): the replicas diverged. Every "
        "rank must apply the same update: with a script of your own, scale every rank's loss alike "
        "(heterotrain.GradScaler() and heterotrain.autocast(), docs/porting.md)"
    )


def check_every_steps(environ: dict[str, str] | None = None) -> int:
    """HETEROTRAIN_CHECK_EVERY_STEPS, or the default; raises ValueError naming the variable."""
    raw = (environ if environ is not None else os.environ).get(CHECK_EVERY_STEPS_ENV, "").strip()
    if not raw:
        return DEFAULT_CHECK_EVERY_STEPS
    if not raw.isdigit():
        raise ValueError(f"{CHECK_EVERY_STEPS_ENV}={raw!r}: give a step count >= 0 (0: at epoch ends only)")
    return int(raw)


def termination_log() -> Path | None:
    """Where the container's termination message goes: the path a kubelet mounts (it exists in a
    container), or the one TERMINATION_LOG_ENV names; None outside a pod."""
    named = os.environ.get(TERMINATION_LOG_ENV)
    if named:
        return Path(named)
    return DEFAULT_TERMINATION_LOG if DEFAULT_TERMINATION_LOG.exists() else None


def end_diverged(message: str) -> NoReturn:
    """End this worker: the verdict logged and written as the container's termination message, the
    process gone at once with DIVERGED_EXIT_CODE (no teardown that could abort with another code)."""
    log.error("DIVERGED: %s; the job stops (exit code %d, not restarted)", message, DIVERGED_EXIT_CODE)
    path = termination_log()
    try:
        if path is not None:
            path.write_text(f"Diverged: {message}\n")
    except OSError as error:
        log.warning("could not write the termination message to %s: %s", path, error)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(DIVERGED_EXIT_CODE)


def _raise(message: str) -> NoReturn:
    raise Diverged(message)


@dataclass
class DivergenceGuard:
    """One rank's guard. `after_step` at every step boundary (every rank at the same step counts),
    `at_epoch_end` after the epoch's averaging; both are collectives when they check."""

    params: Sequence[nn.Parameter]
    world_size: int
    device: torch.device
    every_steps: int = field(default_factory=check_every_steps)
    on_diverged: Callable[[str], NoReturn] = end_diverged
    steps: int = 0  # steps this rank has finished under this guard
    skipped_in_a_row: int = 0
    bad_step: int = -1

    def record_loss(self, loss: float, taken: bool = True) -> None:
        """This rank's loss of the step just finished (local, or the global one), and whether the
        optimizer took the step. Raises nothing by itself: the verdict comes at the next check."""
        if not taken:
            self.skipped_in_a_row += 1
            if self.skipped_in_a_row > MAX_SKIPPED_IN_A_ROW:
                self.on_diverged(
                    f"the loss scale collapsed: {self.skipped_in_a_row} steps in a row overflowed, up to "
                    f"step {self.steps}"
                )
            return
        self.skipped_in_a_row = 0
        if not math.isfinite(loss) and self.bad_step < 0:
            self.bad_step = self.steps

    def record_shared_loss(self, loss: float, taken: bool, epoch: int, suspects: Sequence[int] = ()) -> None:
        """A loss every rank sees alike (the data strategy's global loss, esync's round loss): a
        non-finite one on a step the optimizer took ends the job at once, on every rank together, with
        no collective of its own. `suspects`: the ranks whose own gradient was non-finite."""
        self.record_loss(loss, taken)
        if taken and not math.isfinite(loss):
            named = f" (non-finite gradient on rank {', '.join(map(str, suspects))})" if suspects else ""
            self.on_diverged(f"non-finite loss {loss} at step {self.steps + 1} (epoch {epoch}){named}")

    def after_step(self, epoch: int, compare: bool = True) -> None:
        """A step is done on every rank. `compare`: the replicas should be equal now (the data strategy);
        otherwise only finiteness is checked."""
        self.steps += 1
        due = self.steps == 1 or (self.every_steps > 0 and self.steps % self.every_steps == 0)
        if due:
            self.check(f"after step {self.steps} (epoch {epoch})", compare)

    def at_epoch_end(self, epoch: int) -> None:
        """The epoch's averaging is done: every strategy's replicas should be equal."""
        self.check(f"at the end of epoch {epoch} (step {self.steps})", compare=True)

    def check(self, where: str, compare: bool) -> None:
        """Every rank's checksum, compared on every rank (a collective)."""
        mine = checksum(self.params, self.bad_step)
        found = verdict(self.gather(mine), where, compare)
        if found is not None:
            self.on_diverged(found)

    def gather(self, mine: Checksum) -> list[Checksum]:
        if self.world_size == 1:
            return [mine]
        values = torch.tensor(mine.as_list(), dtype=torch.float64, device=self.device)
        gathered = [torch.empty_like(values) for _ in range(self.world_size)]
        dist.all_gather(gathered, values)
        rows = [row.tolist() for row in gathered]
        return [Checksum(t, s, m, int(b)) for t, s, m, b in rows]


def raising_guard(params: Sequence[nn.Parameter], world_size: int, device: torch.device) -> DivergenceGuard:
    """A guard that raises Diverged instead of ending the process (for embedding programs and tests)."""
    return DivergenceGuard(params, world_size, device, on_diverged=_raise)
