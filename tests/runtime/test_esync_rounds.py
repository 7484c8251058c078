"""ESync's round bounds: maxLocalSteps caps the fastest worker's local steps, and a round that a
stalled worker never joins ends in an error after roundTimeoutSeconds (the job then restarts)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.runtime.jobs import SPEEDS, run_job
from tests.runtime.spawn import run_ranks

from hetero_operator.plan import ESyncParams, Strategy
from hetero_runtime.local import initial_plan

pytestmark = [pytest.mark.ranks, pytest.mark.timeout(200)]


def test_max_local_steps_caps_every_round(tmp_path: Path) -> None:
    plan = initial_plan(Strategy.ESYNC, SPEEDS, 64).model_copy(
        update={"esync": ESyncParams(max_local_steps=2)}
    )
    # Dilated as in test_strategies_job: uncapped, the fastest worker takes about 4 steps a round.
    results = run_job(tmp_path, plan, 2, speeds=[s / 4 for s in SPEEDS]).results()
    steps = [sum(e["steps"] for e in r["epochs"]) for r in results]
    rounds = [sum(e["extra"]["rounds"] for e in r["epochs"]) for r in results]
    assert len(set(rounds)) == 1 and rounds[0] > 0
    assert all(s <= 2 * r for s, r in zip(steps, rounds, strict=True))
    assert steps[0] > 1.5 * rounds[0]  # the cap, not the state service, ended the fastest's rounds
    assert steps[2] == rounds[2]  # the slowest still takes exactly one step


def test_a_round_a_worker_never_joins_times_out(tmp_path: Path) -> None:
    first, _ = run_ranks("esync_round_timeout.py", 2, tmp_path, timeout=60)
    assert first["raised"] is not None and "roundTimeoutSeconds" in first["raised"]
    assert 0.9 <= first["waited"] < 5.0  # well before the peer (6 s) or the group's own timeout (60 s)
