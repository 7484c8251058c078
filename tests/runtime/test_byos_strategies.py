"""The ported digits script, its loop unchanged, under the local-step strategies: each rank steps on its
own planned share and the wrapper averages the parameters after every step (sesgd: in shuffled groups;
dreamddp: the layers of the step's phase) or at the end of each round (esync: rounds whose step count
per rank follows its speed). All reach the accuracy the script reaches under `data`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.runtime.spawn import run_ranks
from tests.runtime.test_byos import TRAIN_SAMPLES

import hetero_runtime.examples.ddp_digits_hetero as ported_example
from hetero_operator.plan import DreamDDPParams, ESyncParams, Plan, SESGDParams, Strategy

PORTED = str(Path(ported_example.__file__))
EPOCHS = 3
ACCURACY = 0.9  # the data strategy's run of the same script reaches 0.9 or more (test_byos.py)
pytestmark = [pytest.mark.ranks, pytest.mark.timeout(200)]


def run_ported(
    tmp_path: Path, plan: Plan, speeds: list[float] | None = None
) -> tuple[float, list[dict[str, object]]]:
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
            **({"HETEROTRAIN_SIMULATED_SPEED": str(speeds[rank])} if speeds else {}),
        },
        args=["--epochs", str(EPOCHS), "--out", str(out)],
    )
    return json.loads(out.read_text())["accuracy"], results


def check_planned_shares(plan: Plan, results: list[dict[str, object]]) -> None:
    for rank, result in enumerate(results):
        epochs = result["epochs"]
        assert isinstance(epochs, list) and len(epochs) == EPOCHS
        assert [e["local_batch"] for e in epochs] == [plan.local_batches[rank]] * EPOCHS
        assert [e["strategy"] for e in epochs] == [plan.strategy.value] * EPOCHS


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


def test_esync_through_the_wrapper_gives_the_faster_ranks_more_local_steps(tmp_path: Path) -> None:
    speeds = [1.0, 0.5, 0.25]
    plan = Plan(
        version=1,
        strategy=Strategy.ESYNC,
        world_size=3,
        global_batch=96,
        local_batches=[32, 32, 32],
        esync=ESyncParams(),
    )
    accuracy, results = run_ported(tmp_path, plan, speeds)
    check_planned_shares(plan, results)
    assert accuracy >= ACCURACY
    totals = [0, 0, 0]
    for epoch in range(EPOCHS):
        steps = [r["epochs"][epoch]["steps"] for r in results]  # type: ignore[index]
        totals = [t + k for t, k in zip(totals, steps, strict=True)]
        samples = [r["epochs"][epoch]["samples"] for r in results]  # type: ignore[index]
        rounds = results[0]["epochs"][epoch]["extra"]["rounds"]  # type: ignore[index]
        # The slowest rank takes one step a round (ESync's rule; in at most two rounds a delay of the
        # host's may make another rank look slower), and a faster rank never takes fewer.
        assert rounds <= steps[2] <= rounds + 2, (steps, rounds)
        assert steps[0] >= steps[1] >= steps[2], steps
        # The rounds together use at least an epoch of samples and stop at the first round past it: a
        # round of the speeds' 4 + 2 + 1 steps of 32 (twice that, for the host's noise).
        assert TRAIN_SAMPLES <= sum(samples) < TRAIN_SAMPLES + 2 * 32 * 7, samples
        assert all(r["epochs"][epoch]["global_samples"] == sum(samples) for r in results), samples  # type: ignore[index]
    # At four times the slowest rank's speed, rank 0 takes three or four steps a round on a quiet
    # host; at least 1.5 on one three times overloaded, where every step also waits on the service.
    assert totals[0] >= 1.5 * totals[2], totals


def test_step_end_averaging_follows_the_strategies_schedules(tmp_path: Path) -> None:
    results = run_ranks("byos_averaging.py", 4, tmp_path, timeout=60)
    # Rank r starts with every parameter equal to 2**r: any two groups of two differ in their mean.
    # sesgd weighs each replica by its samples (4/1/2/1); dreamddp averages every rank alike.
    sizes = [4, 1, 2, 1]
    weighted = sum(b * 2.0**r for r, b in enumerate(sizes)) / sum(sizes)
    mean = sum(2.0**r for r in range(4)) / 4
    for rank, result in enumerate(results):
        step = result["sesgd_step"]
        members = step["members"]
        group_mean = sum(sizes[m] * 2.0**m for m in members) / sum(sizes[m] for m in members)
        assert rank in members and step["got"] == pytest.approx([group_mean] * 2)
        assert result["sesgd_epoch_end"] == pytest.approx([weighted, weighted])
        # Phase 0 averages the input-side layer only; phase 1 then the output side.
        assert result["dreamddp_phase_0"] == pytest.approx([2.0**rank, mean])
        assert result["dreamddp_phase_1"] == pytest.approx([mean, mean])
    # Groups of two differ between them: the step's averaging stayed inside each group.
    assert len({tuple(r["sesgd_step"]["got"]) for r in results}) == 2
