"""PyTorch Lightning under `strategy=HeteroStrategy()`: Lightning's own loop trains on the plan's
uneven split, re-split between epochs, with the whole global batch's gradient at every step, and the
digits example on three speeds reaches what the same script reaches in one process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tests.runtime.spawn import run_ranks
from tests.runtime.test_byos import FIRST, SECOND, assert_matches_one_process, run_replanned

import hetero_runtime.examples.lightning_digits as example
from hetero_operator.plan import Plan
from hetero_runtime.local import LocalJob

EXAMPLE = str(Path(example.__file__))


def one_device_each(rank: int) -> dict[str, str]:
    """One process per pod, as the operator starts them."""
    return {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


pytestmark = [pytest.mark.ranks, pytest.mark.timeout(240)]


def test_lightning_steps_with_the_whole_global_batchs_gradient(tmp_path: Path) -> None:
    # No plan applies to epoch 0 (an even split); epochs 1 and 2 split 40/21/9.
    plan = Plan(version=2, apply_at_epoch=1, world_size=3, global_batch=70, local_batches=[40, 21, 9])
    (tmp_path / "plan.json").write_text(plan.to_json())
    results = run_ranks(
        "lightning_sgd.py",
        3,
        tmp_path,
        timeout=150,
        # A new DataLoader every epoch: the planned batches carry on from where the last one was.
        extra_env={"HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json"), "RELOAD": "1"},
        rank_env=one_device_each,
    )
    # Two steps an epoch (70 samples, then the 71st, which falls to rank 0); a rank's share of a
    # step with no sample of its own is 0 (it computes on a stand-in that counts zero).
    assert [r["batch_lengths"] for r in results] == [
        [24, 1, 40, 1, 40, 1],
        [23, 0, 21, 0, 21, 0],
        [23, 0, 9, 0, 9, 0],
    ]
    assert all(r["plan_versions"] == [0, 2, 2] for r in results)
    first = results[0]
    assert first["samples_per_epoch"] == [True, True, True] and first["orders_differ"]
    # The weights Lightning trained are those of plain SGD on the same global batches in one process.
    assert first["moved"] > 0.1
    assert first["max_abs_diff"] < 1e-5 * first["moved"], first


def test_lightning_resumes_from_its_checkpoint_where_the_loader_was(tmp_path: Path) -> None:
    """Two epochs, Lightning's last checkpoint, a new run to three: the weights of three epochs
    straight, to the bit (the loader's epoch, position and plan came back with the checkpoint)."""
    plan = Plan(version=2, apply_at_epoch=1, world_size=3, global_batch=70, local_batches=[40, 21, 9])
    (tmp_path / "plan.json").write_text(plan.to_json())

    def run(name: str, epochs: int, checkpoints: Path | None = None) -> list[dict[str, Any]]:
        (tmp_path / name).mkdir()
        env = {"HETEROTRAIN_PLAN_SOURCE": str(tmp_path / "plan.json"), "EPOCHS": str(epochs)}
        env |= {"CHECKPOINTS": str(checkpoints)} if checkpoints is not None else {}
        return run_ranks("lightning_sgd.py", 3, tmp_path / name, 150, env, one_device_each)

    straight = run("straight", 3)
    first = run("first", 2, tmp_path / "checkpoints")
    resumed = run("resumed", 3, tmp_path / "checkpoints")
    assert [r["steps"] for r in (straight[0], first[0], resumed[0])] == [6, 4, 2]
    assert resumed[0]["plan_versions"] == [2] and resumed[0]["batch_lengths"] == [40, 1]
    assert resumed[0]["weights"] == straight[0]["weights"]


@pytest.fixture(scope="module")
def on_three_speeds(tmp_path_factory: pytest.TempPathFactory) -> LocalJob:
    return run_replanned(tmp_path_factory.mktemp("lightning"), EXAMPLE)


def test_lightning_example_on_three_speeds_matches_one_process(
    on_three_speeds: LocalJob, tmp_path: Path
) -> None:
    assert_matches_one_process(on_three_speeds, EXAMPLE, tmp_path)
    # Re-split between epochs, without a restart.
    assert on_three_speeds.restarts == 0
    for rank, result in enumerate(on_three_speeds.results()):
        assert result["plan_history"] == [[0, 1], [2, 2]]
        batches = [epoch["local_batch"] for epoch in result["epochs"]]
        assert batches == [FIRST.local_batches[rank]] * 2 + [SECOND.local_batches[rank]] * 2
