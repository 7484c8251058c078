"""A worker that slows down mid-job, for the closed loop on the test bed: once the job's split has
settled, one process node is slowed (the test bed's slowdown annotation divides the simulated speed
of the pods on it), and, when asked, restored once the rebalancer has answered. Passed to `run_demo`
as its `on_tick`; what it saw is kept for the report."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_operator.demo.run import progress_lines
from hetero_operator.rebalance.settings import RebalancerTuning
from hetero_operator.rebalance.watch import SPEED_CHANGED
from hetero_operator.testbed.cluster import Testbed
from hetero_operator.testbed.local_pods import SLOWDOWN_ANNOTATION
from hetero_operator.testbed.prometheus import SCRAPE_INTERVAL_SECONDS

# A change reaches the rebalancer a scrape interval and a pass after it happened, at each of its two
# looks (the epoch that shows it, the steps that confirm it).
METRICS_DELAY_SECONDS = 2 * (SCRAPE_INTERVAL_SECONDS + RebalancerTuning().tick_seconds)


def first_epoch_of(rows: Sequence[Mapping[str, Any]], version: int) -> int | None:
    """The first epoch rank 0 ran under plan `version` or a later one (report rows)."""
    return min((int(r["epoch"]) for r in rows if int(r["plan_version"]) >= version), default=None)


def metrics_delay_epochs(rows: Sequence[Mapping[str, Any]], slowed_in: int, started: int | None) -> int:
    """The metrics' delay in epochs of the slowed split (their median length) before `started`."""
    lengths = [float(r["wall_seconds"]) for r in rows if slowed_in < int(r["epoch"]) < (started or 0)]
    return math.ceil(METRICS_DELAY_SECONDS / statistics.median(lengths)) if lengths else 0


def _epoch(status: dict[str, Any]) -> int:
    return int((status.get("progress") or {}).get("epoch") or 0)


def answer_after(status: dict[str, Any], epoch: int) -> dict[str, Any] | None:
    """The first rebalance record after status epoch `epoch` that answers a change in worker speed."""
    return next(
        (
            r
            for r in status.get("rebalances") or []
            if r["reason"].startswith(SPEED_CHANGED) and r["epoch"] > epoch
        ),
        None,
    )


@dataclass
class Slowdown:
    testbed: Testbed
    job: str
    node: str
    factor: float = 2.0
    restore: bool = True  # take the slowdown off again once the rebalancer answered it
    settle_epochs: int = 2  # epochs on one split, after the last rebalance, before the slowdown
    slowed_at: int | None = None  # the job's status epoch when the node was slowed
    slowed_in: int | None = None  # the epoch rank 0 was running then (its own log)
    slowed: dict[str, Any] | None = None  # the rebalance record that answered it
    recovered_at: int | None = None
    recovered: dict[str, Any] | None = None
    plans: dict[int, list[int]] = field(default_factory=dict)  # local batches by plan version
    last_running: float | None = None  # wall-clock seconds of the last look at the job Running
    answered_time: float | None = None  # wall-clock seconds when the answer was first seen
    since: float = field(default_factory=time.time)  # made before the job is submitted

    def __call__(self, state: dict[str, Any]) -> None:
        status = state.get("status") or {}
        epoch = _epoch(status)
        plan = status.get("plan") or {}
        if plan.get("version"):
            self.plans[int(plan["version"])] = list(plan.get("localBatches") or [])
        if status.get("phase") == "Running":
            self.last_running = time.time()
        if self.slowed_at is None:
            records = status.get("rebalances") or []
            settled = records and epoch >= records[-1]["epoch"] + self.settle_epochs
            if settled and epoch >= 2 * self.settle_epochs:
                self._annotate(f"{SLOWDOWN_ANNOTATION}={self.factor:g}", "--overwrite")
                self.slowed_at = epoch
                self.slowed_in = len(progress_lines(self.testbed, self.job, self.since)) + 1
            return
        if self.slowed is None:
            self.slowed = answer_after(status, self.slowed_at)
            self.answered_time = time.time() if self.slowed is not None else None
            return
        if not self.restore:
            return
        if self.recovered_at is None and epoch >= self.slowed["epoch"] + 1:
            self.clear()
            self.recovered_at = epoch
            return
        if self.recovered_at is not None and self.recovered is None:
            self.recovered = answer_after(status, self.recovered_at)

    def under_answer(self) -> float | None:
        """A moment well inside the run of the plan that answered the slowdown (its series end when the
        workers do, which the job's status shows only later)."""
        if self.answered_time is None or self.last_running is None:
            return None
        return (self.answered_time + self.last_running) / 2

    def clear(self) -> None:
        self._annotate(f"{SLOWDOWN_ANNOTATION}-", check=False)

    def _annotate(self, *args: str, check: bool = True) -> None:
        self.testbed.kubectl("annotate", "node", self.node, *args, check=check)

    def seen(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "factor": self.factor,
            "slowed_at": self.slowed_at,
            "slowed_in": self.slowed_in,
            "slowed": self.slowed,
            "recovered_at": self.recovered_at,
            "recovered": self.recovered,
        }


def slowed_rank(status: Mapping[str, Any], node: str) -> int | None:
    workers = (status.get("allocation") or {}).get("workers") or []
    return next((int(w["rank"]) for w in workers if w.get("node") == node), None)


def slowdown_factor(before: Sequence[float], after: Sequence[float], rank: int) -> float | None:
    """How much slower `rank` ran after the slowdown, measured against the other ranks of the same
    runs (their speeds did not change, so the run's simulated base cancels): the mean over them of
    (rank / other before) over (rank / other after)."""
    others = [r for r in range(len(before)) if r != rank]
    if len(before) != len(after) or rank >= len(before) or not others or min([*before, *after]) <= 0:
        return None
    return statistics.mean((before[rank] / before[r]) / (after[rank] / after[r]) for r in others)


def recovery(
    report: Mapping[str, Any], seen: Mapping[str, Any], rank: int, target: float, after: Sequence[float]
) -> dict[str, Any]:
    """How the job came back after the slowdown, against the ideal of the new speeds: the speeds
    measured under the control run with the slowed rank's divided by the slowdown measured in the
    job (its own speeds under its first plan against those under the plan that answered the
    slowdown, `after`). The slowest rank, which sets the control's pace, must be another one, so that
    the control's pace still holds. Per epoch from the one the slowdown began in: samples/s over the
    control's, over that ideal."""
    control = report.get("control") or {}
    speeds = list(control.get("measured_speeds") or [])
    slowed_in = seen.get("slowed_in")
    factor = slowdown_factor(control.get("own_speeds") or [], after, rank)
    if not speeds or slowed_in is None or rank >= len(speeds) or factor is None:
        return {}
    if not control.get("speedup_per_epoch"):  # no comparable control run
        return {}
    new_speeds = [v / factor if r == rank else v for r, v in enumerate(speeds)]
    if min(new_speeds) < min(speeds):
        return {}  # the slowed rank became the slowest: the control's pace no longer holds
    ideal = sum(new_speeds) / (len(new_speeds) * min(new_speeds))
    rows = report["per_epoch"]
    epochs = [
        {"epoch": int(row["epoch"]), "seconds": float(row["wall_seconds"]), "of_new_ideal": x / ideal}
        for row, x in zip(rows, control["speedup_per_epoch"], strict=True)
        if x is not None and int(row["epoch"]) >= slowed_in
    ]
    back = next((e["epoch"] for e in epochs if e["epoch"] > slowed_in and e["of_new_ideal"] >= target), None)
    answer = seen.get("slowed") or {}
    started = first_epoch_of(rows, int(answer["toVersion"])) if answer else None
    return {
        "slowed_rank": rank,
        "measured_factor": factor,
        "speeds_after": list(after),
        "new_ideal_speedup": ideal,
        "new_split_from_epoch": started,
        "epochs": epochs,
        "back_at_epoch": back,
        "epochs_to_back": None if back is None else back - slowed_in,
        "metrics_delay_epochs": metrics_delay_epochs(rows, slowed_in, started),
    }
