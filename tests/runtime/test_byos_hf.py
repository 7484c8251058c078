"""A Hugging Face `transformers` GPT-2, built from a small config and trained from scratch on the
generated corpus through the wrapper: on three ranks split unevenly by a plan file it learns (the
held-out loss falls far below ln(vocabulary), a uniform guess) and every rank ends with the same
weights; one process with no cluster learns the same, to the same loss."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.runtime.jobs import SPEEDS
from tests.runtime.spawn import run_ranks

import hetero_runtime.examples.hf_causal_lm as example
from hetero_operator.plan import Strategy
from hetero_runtime.local import initial_plan

SCRIPT = str(Path(example.__file__))
EPOCHS = 8
SENTENCES = 800
PLAN = initial_plan(Strategy.DATA, SPEEDS, 32)  # 18/9/5 of the global batch of 32, as speeds 1:0.5:0.25
ARGS = ["--epochs", str(EPOCHS), "--batch-size", "32", "--sentences", str(SENTENCES)]
# A model that learnt only how often each character occurs stays near ln(vocabulary); the sentences'
# template and word lists take it well below half of that.
TARGET = 0.45
pytestmark = [pytest.mark.ranks, pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def three_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    work = tmp_path_factory.mktemp("hf-three")
    (work / "plan.json").write_text(PLAN.to_json())
    records = run_ranks(
        SCRIPT,
        3,
        work,
        timeout=100,
        extra_env={"HETEROTRAIN_PLAN_SOURCE": str(work / "plan.json"), "LOCAL_WORLD_SIZE": "3"},
        rank_env=lambda rank: {"HETEROTRAIN_RESULT_FILE": str(work / f"rank-{rank}.json")},
        args=[*ARGS, "--out", str(work / "out.json")],
    )
    return json.loads((work / "out.json").read_text()), records


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The script alone, as `python hf_causal_lm.py`: no rank variables, no plan, no launcher."""
    out = tmp_path_factory.mktemp("hf-one") / "out.json"
    cluster = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HETEROTRAIN_") and k not in cluster}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, SCRIPT, *ARGS, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return dict(json.loads(out.read_text()))


def assert_learnt(metrics: dict[str, Any]) -> None:
    uniform = math.log(metrics["vocabulary"])
    assert metrics["uniform_loss"] == pytest.approx(uniform)
    # Untrained, the model is no better than a uniform guess; trained, far better.
    assert metrics["initial_loss"] > 0.9 * uniform, metrics
    assert metrics["held_out_loss"] < TARGET * uniform, metrics
    assert metrics["perplexity"] == pytest.approx(math.exp(metrics["held_out_loss"]))


def test_three_uneven_ranks_learn_with_identical_weights(
    three_ranks: tuple[dict[str, Any], list[dict[str, Any]]],
) -> None:
    metrics, records = three_ranks
    assert metrics["world_size"] == 3
    assert_learnt(metrics)
    assert len(set(metrics["checksums"])) == 1, metrics["checksums"]
    # Each rank trained on the share the plan file gave it, and every sample once per epoch.
    sequences = len(example.corpus(SENTENCES)[1])
    for rank, record in enumerate(records):
        assert [epoch["local_batch"] for epoch in record["epochs"]] == [PLAN.local_batches[rank]] * EPOCHS
    for epoch in range(EPOCHS):
        assert sum(record["epochs"][epoch]["samples"] for record in records) == sequences


def test_one_process_without_a_cluster_learns(one_process: dict[str, Any]) -> None:
    assert one_process["world_size"] == 1
    assert_learnt(one_process)


def test_uneven_split_reaches_what_one_process_reaches(
    three_ranks: tuple[dict[str, Any], list[dict[str, Any]]], one_process: dict[str, Any]
) -> None:
    together, alone = three_ranks[0], one_process
    # The same global batches in the same order: the updates differ only by rounding.
    assert together["initial_loss"] == pytest.approx(alone["initial_loss"], abs=1e-5)
    assert together["held_out_loss"] == pytest.approx(alone["held_out_loss"], abs=1e-3)
