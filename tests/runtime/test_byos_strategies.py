"""The ported digits script, its loop unchanged, under the local-step strategies: each rank steps on its
own planned share and the wrapper averages the parameters after every step (sesgd: in shuffled groups;
dreamddp: the layers of the step's phase). Both reach the accuracy the script reaches under `data`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks

import hetero_runtime.examples.ddp_digits_hetero as ported_example
from hetero_operator.plan import DreamDDPParams, Plan, SESGDParams, Strategy

PORTED = str(Path(ported_example.__file__))
EPOCHS = 3
ACCURACY = 0.9  # the data strategy's run of the same script reaches 0.9 or more (test_byos.py)
pytestmark = pytest.mark.timeout(200)


def run_ported(tmp_path: Path, plan: Plan) -> tuple[float, list[dict[str, object]]]:
    (tmp_path / "plan.json").write_text(plan.to_json())
    out = tmp_path / "out.json"
    results = run_ranks(
        PORTED,
        plan.world_size,
        tmp_path,
        timeout=150,
        extra_env={
            "HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json"),
            "LOCAL_WORLD_SIZE": str(plan.world_size),
        },
        rank_env=lambda rank: {
            "LOCAL_RANK": str(rank),
            "HETEROTRAIN_RESULT_FILE": str(tmp_path / f"rank-{rank}.json"),
        },
        args=["--epochs", str(EPOCHS), "--out", str(out)],
    )
    return json.loads(out.read_text())["accuracy"], results


def check_planned_shares(plan: Plan, results: list[dict[str, object]]) -> None:
    for rank, result in enumerate(results):
        epochs = result["epochs"]
        assert isinstance(epochs, list) and len(epochs) == EPOCHS
        assert [e["local_batch"] for e in epochs] == [plan.local_batches[rank]] * EPOCHS


def test_sesgd_through_the_wrapper_reaches_the_data_accuracy(tmp_path: Path) -> None:
    plan = Plan(
        version=1,
        strategy=Strategy.SESGD,
        world_size=4,
        global_batch=64,
        local_batches=[24, 16, 14, 10],
        sesgd=SESGDParams(groups=2, seed=3),
    )
    accuracy, results = run_ported(tmp_path, plan)
    check_planned_shares(plan, results)
    assert accuracy >= ACCURACY


def test_dreamddp_through_the_wrapper_reaches_the_data_accuracy(tmp_path: Path) -> None:
    plan = Plan(
        version=1,
        strategy=Strategy.DREAMDDP,
        world_size=3,
        global_batch=64,
        local_batches=[32, 18, 14],
        dreamddp=DreamDDPParams(period=3),
    )
    accuracy, results = run_ported(tmp_path, plan)
    check_planned_shares(plan, results)
    assert accuracy >= ACCURACY


def test_step_end_averaging_follows_the_strategies_schedules(tmp_path: Path) -> None:
    results = run_ranks("byos_averaging.py", 4, tmp_path, timeout=60)
    # Rank r starts with every parameter equal to 2**r: any two groups of two differ in their mean.
    mean = sum(2.0**r for r in range(4)) / 4
    for rank, result in enumerate(results):
        step = result["sesgd_step"]
        assert step["got"] == pytest.approx([step["group_mean"]] * 2)
        assert result["sesgd_epoch_end"] == pytest.approx([mean, mean])
        # Phase 0 averages the input-side layer only; phase 1 then the output side.
        assert result["dreamddp_phase_0"] == pytest.approx([2.0**rank, mean])
        assert result["dreamddp_phase_1"] == pytest.approx([mean, mean])
    # Groups of two differ between them: the step's averaging stayed inside each group.
    assert len({r["sesgd_step"]["group_mean"] for r in results}) == 2
