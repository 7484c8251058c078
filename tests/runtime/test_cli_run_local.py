"""`heterotrain run-local` end to end: the tiny transformer LM reaches its stated loss; bad input fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetero_runtime.examples.tiny_lm import TARGET_LOSS

pytestmark = pytest.mark.ranks

CLI = [sys.executable, "-m", "hetero_operator", "run-local"]


@pytest.mark.timeout(200)
def test_run_local_trains_the_tiny_language_model(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *CLI,
            "--workers",
            "3",
            "--speeds",
            "1,0.5,0.25",
            "--strategy",
            "data",
            "--epochs",
            "3",
            "--global-batch",
            "32",
            "--work-dir",
            str(tmp_path),
            "tiny_lm",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done" in done.stderr and "validation_loss" in done.stderr
    results = [json.loads((tmp_path / "results" / f"rank-{r}.json").read_text()) for r in range(3)]
    assert results[0]["final_evaluation"]["validation_loss"] < TARGET_LOSS
    assert [r["epochs"][0]["local_batch"] for r in results] == [18, 9, 5]


def test_run_local_rejects_speeds_that_do_not_match_the_workers() -> None:
    env = {**os.environ, "COLUMNS": "250"}
    done = subprocess.run(
        [*CLI, "--workers", "3", "--speeds", "1,0.5", "digits"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode != 0
    assert "one per worker" in done.stderr


@pytest.mark.timeout(120)
def test_worker_command_runs_a_single_process_job_from_the_environment(tmp_path: Path) -> None:
    """What a pod runs: no plan source and one worker, so an even default plan (version 0) is used."""
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "HETEROTRAIN_EPOCHS": "2",
        "HETEROTRAIN_RESULT_FILE": str(tmp_path / "result.json"),
        "HETEROTRAIN_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "hetero_operator", "worker", "digits"],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["plan_history"] == [[0, 0]] and len(result["epochs"]) == 2
    assert result["epochs"][0]["local_batch"] == 64
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checkpoint-epoch-000001.pt",
        "checkpoint-epoch-000002.pt",
    ]
