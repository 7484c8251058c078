"""Checkpoint first: workers asked to stop (the operator's annotation, or SIGTERM) save at the next step
boundary, sampler position included, exit with 143, and a restarted job continues from that step.

The annotation reaches the workers as the Downward API file the test bed's process nodes write; here
the test writes that file itself, once the first epoch has ended.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.runtime.jobs import SPEEDS

from hetero_operator.plan import CHECKPOINT_REQUESTED_ANNOTATION, POD_ANNOTATIONS_FILE_ENV, Plan, Strategy
from hetero_runtime.checkpoint import latest_checkpoint, load
from hetero_runtime.examples.digits import HIDDEN_ENV, PASSES_ENV
from hetero_runtime.local import LocalJob, LocalJobSpec, example_layer_costs, initial_plan
from hetero_runtime.stopping import STOPPED_EXIT_CODE

EPOCHS = 3
PASSES = 8  # with a wider model, an epoch of 180 steps lasts about a second: long enough to stop in
DATASET = 1437 * PASSES
pytestmark = [pytest.mark.ranks, pytest.mark.timeout(300)]


def spec_for(work_dir: Path, plan: Plan, annotations: Path) -> LocalJobSpec:
    return LocalJobSpec(
        target="digits",
        speeds=list(SPEEDS),
        work_dir=work_dir,
        plan=plan,
        epochs=EPOCHS,
        max_restarts=0,
        extra_env={PASSES_ENV: str(PASSES), HIDDEN_ENV: "512", POD_ANNOTATIONS_FILE_ENV: str(annotations)},
    )


def run(spec: LocalJobSpec, on_progress: Any = None) -> int:
    return LocalJob(spec, on_progress=on_progress).run(240)


def annotate(path: Path) -> None:
    """What the node agent writes once the operator annotated the pod (key="value" per line)."""
    path.write_text(f'other="1"\n{CHECKPOINT_REQUESTED_ANNOTATION}="2026-11-24T08:00:00Z"\n')


def stop_after_first_epoch(work_dir: Path, plan: Plan) -> tuple[LocalJobSpec, list[dict[str, Any]]]:
    annotations = work_dir / "podinfo-annotations"
    work_dir.mkdir(parents=True, exist_ok=True)
    annotations.write_text('other="1"\n')
    spec = spec_for(work_dir, plan, annotations)

    def on_progress(payload: dict[str, Any]) -> None:
        if payload["epoch"] == 1:
            annotate(annotations)

    assert run(spec, on_progress) == STOPPED_EXIT_CODE
    stopped = [LocalJob(spec).results()[rank] for rank in range(spec.workers)]
    annotations.write_text('other="1"\n')  # the new generation's pods carry no request
    return spec, stopped


def check_stopped_mid_epoch(
    spec: LocalJobSpec, stopped: list[dict[str, Any]], reason: str = CHECKPOINT_REQUESTED_ANNOTATION
) -> dict[str, Any]:
    position = stopped[0]["stopped_at"]
    assert all(r["stopped_at"] == position for r in stopped), "every rank stops after the same step"
    # Each rank stops on the request it saw, or on another's (the vote settles on the same step).
    assert all(r["stopped"] for r in stopped)
    assert any(reason in r["stopped"] for r in stopped)
    assert position["epoch"] == 1 and 0 < position["consumed"] < DATASET, position
    path = latest_checkpoint(spec.checkpoint_dir)
    assert path is not None and path.name == f"checkpoint-epoch-000001-sample-{position['consumed']:09d}.pt"
    state = load(path)
    assert state["epochs_done"] == 1 and state["position"] == position
    return state


def test_a_stopped_data_job_resumes_at_the_step_and_ends_with_identical_weights(tmp_path: Path) -> None:
    plan = initial_plan(Strategy.DATA, SPEEDS, 64)
    spec, stopped = stop_after_first_epoch(tmp_path / "stopped", plan)
    check_stopped_mid_epoch(spec, stopped)
    assert run(spec) == 0
    resumed = LocalJob(spec).results()
    assert all(r["resumed_from_epoch"] == 1 for r in resumed)
    # The resumed run trains exactly the samples the stopped one had left in its epoch.
    left = DATASET - stopped[0]["stopped_at"]["consumed"]
    assert sum(r["epochs"][0]["samples"] for r in resumed) == left

    control = spec_for(tmp_path / "control", plan, tmp_path / "no-annotations")
    assert run(control) == 0
    expected = load(latest_checkpoint(control.checkpoint_dir))["model"]  # type: ignore[arg-type]
    got = load(latest_checkpoint(spec.checkpoint_dir))["model"]  # type: ignore[arg-type]
    for name in expected:
        assert torch.equal(expected[name], got[name]), f"{name} differs from the uninterrupted run"


@pytest.mark.parametrize("strategy", [Strategy.SESGD, Strategy.DREAMDDP, Strategy.ESYNC, Strategy.HETPIPE])
def test_every_strategy_stops_at_a_step_boundary_and_resumes_there(
    tmp_path: Path, strategy: Strategy
) -> None:
    costs = example_layer_costs("digits") if strategy is Strategy.HETPIPE else None
    plan = initial_plan(strategy, SPEEDS, 64, layer_costs=costs)
    spec, stopped = stop_after_first_epoch(tmp_path, plan)
    check_stopped_mid_epoch(spec, stopped)
    assert run(spec) == 0
    resumed = LocalJob(spec).results()
    assert all(r["resumed_from_epoch"] == 1 and r["stopped"] is None for r in resumed)
    assert resumed[0]["final_evaluation"]["accuracy"] >= 0.9


def test_sigterm_stops_a_worker_group_after_a_checkpoint(tmp_path: Path) -> None:
    plan = initial_plan(Strategy.DATA, SPEEDS, 64)
    spec = spec_for(tmp_path, plan, tmp_path / "no-annotations")
    job = LocalJob(spec)
    signalled: list[float] = []

    def on_progress(payload: dict[str, Any]) -> None:
        if payload["epoch"] == 1 and not signalled:
            signalled.append(time.monotonic())
            for process in job.processes:  # as Kubernetes does on pod deletion
                os.kill(process.pid, signal.SIGTERM)

    job.on_progress = on_progress
    job.start()
    try:
        codes = [process.wait(timeout=120) for process in job.processes]
    finally:
        job.stop()
    assert codes == [STOPPED_EXIT_CODE] * 3
    stopped = job.results()
    check_stopped_mid_epoch(spec, stopped, reason="SIGTERM")
